-- leave_actor.lua: LeaveActor.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] actor id.
-- Returns {leases returned to the pool, leases that lost their assignment}; {0, 0} when it already left.
-- Errors: NOT_FOUND for an unknown actor.
-- Invariants: the leases it holds go back to the pool (RELEASED, reason SHUTDOWN) and its quota share is
-- dropped in the same step.

local ak = k('a:' .. ARGV[2])
local live = redis.call('HGET', ak, 'live')
if live == false then return redis.error_reply('NOT_FOUND no actor ' .. ARGV[2]) end
if live == '4' then return {0, 0} end
local returned, unassigned = actor_gone(ARGV[2], 4, 4)
redis.call('HSET', ak, 'hb', int(NOW))
return finish({returned, unassigned})
