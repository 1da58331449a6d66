-- add_prompts.lua: AddPrompts. Each prompt becomes a group of G samples plus R redundant slots.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] G, ARGV[3] R, ARGV[4] step, ARGV[5] priority, ARGV[6] n, then n x (group id or '' for a fresh
-- one, prompt id, task, Prompt blob).
-- Returns {group id per prompt..., groups created, samples added}.
-- Invariants: a group id that exists (or was purged: P gdone) is left alone, so AddPrompts is idempotent;
-- pool score = -priority * 1e9 + group sequence (priority first, then FIFO).

local G, R, step = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local prio, n = tonumber(ARGV[5]), tonumber(ARGV[6])
local out, created, samples = {}, 0, 0
for j = 0, n - 1 do
  local b = 7 + j * 4
  local gid, pid, task, blob = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local fresh = true
  if gid == '' then
    repeat
      gid = pid .. '#' .. redis.call('INCR', k('gid:seq'))
    until redis.call('EXISTS', k('g:' .. gid)) == 0 and redis.call('SISMEMBER', k('gdone'), gid) == 0
  elseif redis.call('EXISTS', k('g:' .. gid)) == 1 or redis.call('SISMEMBER', k('gdone'), gid) == 1 then
    fresh = false
  end
  if fresh then
    local sc = int(-prio * 1e9 + redis.call('INCR', k('gseq')))
    local gk = k('g:' .. gid)
    redis.call('HSET', gk, 'st', 'O', 'pid', pid, 'task', task, 'G', G, 'R', R, 'n', G + R, 'pr', prio,
      'sc', sc, 'step', step, 'created', int(NOW), 'started', 0, 'adm', 0, 'scd', 0, 'prompt', blob)
    local g = {sc = sc, task = task}
    for i = 0, G + R - 1 do
      redis.call('HSET', gk, 'a' .. i, 0)
      pool_add(gid, g, i)
    end
    redis.call('SADD', k('gopen'), gid)
    created = created + 1
    samples = samples + G + R
  end
  out[#out + 1] = gid
end
out[#out + 1] = created
out[#out + 1] = samples
return out
