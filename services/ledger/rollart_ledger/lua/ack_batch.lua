-- ack_batch.lua: AckBatch. The trainer consumed the step's batch: its samples leave the buffer.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] step, ARGV[3] batch id.
-- Returns the samples released (0 when acknowledged before).
-- Errors: NOT_FOUND (no batch for the step), FAILED_PRECONDITION (the step's batch has another id).
-- Invariants: consumed groups end ('K', purged after the retention); they left P inflight when the batch
-- was formed (a group reserved before that rule, started = 1, leaves it here); their samples count as trained.

local bk = k('batch:' .. ARGV[2])
local b = hmap(bk)
if b.id == nil then return redis.error_reply('NOT_FOUND no batch for step ' .. ARGV[2]) end
if b.id ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION the batch of step ' .. ARGV[2] .. ' is ' .. b.id ..
    ', not ' .. ARGV[3])
end
if b.acked == '1' then return 0 end
local released = 0
for gid in string.gmatch(b.groups, '[^,]+') do
  local G = gload(gid)
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'D' then
      if sample_remove(string.sub(s, 3), 'K') then released = released + 1 end
    end
  end
  redis.call('HDEL', k('g:' .. gid), 'prompt')
  group_end(gid, 'K')
  if G.started == '1' then
    redis.call('DECRBY', k('inflight'), G.G)
    redis.call('DECRBY', k('inflight:t:' .. G.task), G.G)
  end
end
redis.call('HSET', bk, 'acked', 1)
return released
