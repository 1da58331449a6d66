-- register_version.lua: RegisterVersion. Versions are append-only and monotone.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] v, ARGV[3] base version (-1: none), ARGV[4] h(v), ARGV[5] PolicyVersion blob, ARGV[6]
-- LedgerCommand blob (VersionPublished) broadcast to relays and actors.
-- Returns {1, blob} when registered, {0, the blob already recorded} when v exists (the caller compares).
-- Errors: FAILED_PRECONDITION when v is not greater than the latest or the base is not registered.
-- Invariants: P latest is the largest registered v; P versions, P vhash and P vers hold the same versions;
-- the broadcast is appended in the same atomic step as the version.

local v = tonumber(ARGV[2])
local base = tonumber(ARGV[3])
local existing = redis.call('HGET', k('versions'), ARGV[2])
if existing then return {0, existing} end
local latest = tn(redis.call('GET', k('latest')), -1)
if v <= latest then
  return redis.error_reply('FAILED_PRECONDITION version ' .. v .. ' is not greater than the latest (' ..
    latest .. '); versions are append-only and monotone')
end
if base >= 0 and redis.call('HEXISTS', k('versions'), ARGV[3]) == 0 then
  return redis.error_reply('FAILED_PRECONDITION base version ' .. base .. ' is not registered')
end
redis.call('HSET', k('versions'), ARGV[2], ARGV[5])
redis.call('HSET', k('vhash'), ARGV[2], ARGV[4])
redis.call('ZADD', k('vers'), v, ARGV[2])
redis.call('SET', k('latest'), ARGV[2])
cmd_push('', '2,1', '0', {'c', ARGV[6]})
return finish({1, ARGV[5]})
