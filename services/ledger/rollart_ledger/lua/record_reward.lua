-- record_reward.lua: RecordReward. Scores a buffered sample; the first reward stands.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] trajectory id, ARGV[3] failed '1'/'0', ARGV[4] reward.
-- Returns {recorded, reward in force, unknown trajectory, group ready}.
-- Invariants: failed = 1 removes the sample and re-pools its slot (a complete group opens again); a
-- rejected or unknown trajectory is 'unknown'; a consumed or evicted one, or one the reaper un-admitted past
-- the score deadline (trj mark F, counted once as failed there), is neither recorded nor unknown; a scored or
-- failed sample leaves P unscored.

local tid = ARGV[2]
local t = redis.call('HGET', k('trj'), tid)
if t == false or string.sub(t, 1, 1) == 'R' then return {0, '0', 1, 0} end
if string.sub(t, 1, 1) ~= 'B' then return {0, '0', 0, 0} end
local sk = k('s:' .. tid)
local S = hmap(sk)
if S.scd == '1' then return {0, S.rw, 0, 0} end
if ARGV[3] == '1' then
  unadmit(tid, 'F')
  redis.call('HINCRBY', k('stats'), 'reward_failed', 1)
  return finish({1, '0', 0, 0})
end
redis.call('HSET', sk, 'rw', ARGV[4], 'scd', 1)
redis.call('ZREM', k('unscored'), tid)
redis.call('INCR', k('buf:scored'))
local G = gload(S.gid)
G.scd = redis.call('HINCRBY', k('g:' .. S.gid), 'scd', 1)
ready_update(S.gid, G)
local ready = 0
if G.st == 'C' and G.scd >= G.G then ready = 1 end
return {1, ARGV[4], 0, ready}
