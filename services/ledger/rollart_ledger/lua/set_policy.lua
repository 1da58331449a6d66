-- set_policy.lua: SetJobPolicy. Fixes the job id on the first call and stores the policy.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] job id, ARGV[3] JobPolicy blob (defaults filled), ARGV[4..] field, value pairs (policy.fields).
-- Returns the hash written: 'pol' (in force at once: no step was planned yet) or 'pol:next' (installed
-- by the next plan_commit, so one step is judged by one policy).
-- Errors: FAILED_PRECONDITION when P job names another job (nothing written).
-- Invariants: P policy is always the last policy set (GetJobPolicy); the TTL in force follows a policy
-- that takes effect at once.

local job = redis.call('GET', k('job'))
if job and job ~= ARGV[2] then
  return redis.error_reply('FAILED_PRECONDITION this ledger serves job ' .. job .. ', not ' .. ARGV[2])
end
redis.call('SET', k('job'), ARGV[2])
redis.call('SET', k('policy'), ARGV[3])
local target = 'pol:next'
if redis.call('EXISTS', k('cur')) == 0 then target = 'pol' end
redis.call('DEL', k(target))
redis.call('HSET', k(target), 'blob', ARGV[3])
for i = 4, #ARGV, 2 do redis.call('HSET', k(target), ARGV[i], ARGV[i + 1]) end
if target == 'pol' then
  POL = nil
  ttl_recompute()
end
return target
