-- reap.lua: one tick of the reaper.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] lease retention ms, ARGV[3] actor retention ms, ARGV[4] score deadline ms.
-- Returns {leases expired, actors presumed dead, final leases purged, samples un-admitted unscored}.
-- Invariants: bounded work per tick (256 leases, 256 groups, 256 unscored samples); a silent actor is
-- presumed dead after the policy's actor timeout and its leases return to the pool; an admitted sample still
-- without its reward a score deadline after its admission (its scorer died or hung: nobody else holds the
-- scoring) is un-admitted as a failed scoring (fate failed, counted once, stats score_expired), its slot
-- re-pooled and a complete group opened again, so it cannot hold the group and the in-flight window for ever;
-- final leases, their verdicts, consumed groups and departed actors are purged after their retention (a
-- purged group id stays in P gdone so that AddPrompts remains idempotent).

local expired = expire_due(256)
local dead = 0
local tout = pol('tout')
for _, aid in ipairs(redis.call('SMEMBERS', k('actors'))) do
  local r = redis.call('HMGET', k('a:' .. aid), 'live', 'hb')
  if r[1] == '1' or r[1] == '2' then
    if tonumber(r[2]) + tout < NOW then
      actor_gone(aid, 3, 2)
      dead = dead + 1
    end
  elseif r[1] == false or tonumber(r[2]) < NOW - tonumber(ARGV[3]) then
    redis.call('DEL', k('a:' .. aid))
    redis.call('SREM', k('actors'), aid)
  end
end
redis.call('ZREMRANGEBYSCORE', k('holders'), '-inf', '(' .. int(NOW - 60000))
local unscored = 0
local late = redis.call('ZRANGEBYSCORE', k('unscored'), '-inf', '(' .. int(NOW - tonumber(ARGV[4])), 'LIMIT', 0, 256)
for _, tid in ipairs(late) do
  redis.call('ZREM', k('unscored'), tid)
  -- scored or gone since: nothing to do (the index follows the buffer, this only guards it)
  if redis.call('HGET', k('s:' .. tid), 'scd') == '0' and unadmit(tid, 'F') then
    unscored = unscored + 1
  end
end
if unscored > 0 then redis.call('HINCRBY', k('stats'), 'score_expired', unscored) end
local purged = 0
local cutoff = '(' .. int(NOW - tonumber(ARGV[2]))
for _, lid in ipairs(redis.call('ZRANGEBYSCORE', k('ended'), '-inf', cutoff, 'LIMIT', 0, 256)) do
  local traj = redis.call('HGET', k('l:' .. lid), 'traj')
  if traj then
    local t = redis.call('HGET', k('trj'), traj)
    if t and string.sub(t, 1, 1) ~= 'B' then redis.call('HDEL', k('trj'), traj) end
  end
  redis.call('DEL', k('l:' .. lid), k('vd:' .. lid))
  redis.call('ZREM', k('leases'), lid)
  redis.call('ZREM', k('ended'), lid)
  purged = purged + 1
end
for _, gid in ipairs(redis.call('ZRANGEBYSCORE', k('gended'), '-inf', cutoff, 'LIMIT', 0, 256)) do
  redis.call('DEL', k('g:' .. gid))
  redis.call('SADD', k('gdone'), gid)
  redis.call('ZREM', k('gended'), gid)
end
return finish({expired, dead, purged, unscored})
