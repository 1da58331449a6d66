-- ensure_policy.lua: writes the default policy fields once, so that every script reads the same numbers.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] JobPolicy blob of the defaults, ARGV[3..] field, value pairs (policy.fields).
-- Returns 1 when it wrote P pol, 0 when a policy was already there (left alone).

if redis.call('EXISTS', k('pol')) == 1 then return 0 end
redis.call('HSET', k('pol'), 'blob', ARGV[2])
for i = 3, #ARGV, 2 do redis.call('HSET', k('pol'), ARGV[i], ARGV[i + 1]) end
POL = nil
ttl_recompute()
return 1
