-- ack_command.lua: AckCommand. Records a subscriber's outcome of one command, once.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] subscriber id, ARGV[3] sequence, ARGV[4] ok '1'/'0', ARGV[5] error text, ARGV[6] commit order id
-- ('' if the command is not a Commit), ARGV[7] the subscriber's weights blob ('' if none).
-- Returns 1 when recorded, 0 when this (subscriber, sequence) was acknowledged before (nothing changes).
-- Invariants: P commit holds the first outcome per order ('ok' or 'err:<message>'); reported weights
-- update a known actor only.

local field = ARGV[2] .. ':' .. ARGV[3]
if redis.call('HSETNX', k('acks'), field, ARGV[4] .. '|' .. ARGV[5]) == 0 then return 0 end
if ARGV[6] ~= '' then
  local state = 'ok'
  if ARGV[4] ~= '1' then state = 'err:' .. ARGV[5] end
  redis.call('HSET', k('commit'), ARGV[6], state)
end
if ARGV[7] ~= '' and redis.call('EXISTS', k('a:' .. ARGV[2])) == 1 then
  if redis.call('HGET', k('a:' .. ARGV[2]), 'w') ~= ARGV[7] then actors_changed() end
  redis.call('HSET', k('a:' .. ARGV[2]), 'w', ARGV[7])
end
return 1
