-- renew.lua: RenewLease. Extends an active lease by the TTL in force.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] lease id, ARGV[3] holder.
-- Returns the lease row {HGETALL, prompt blob, h(v_j)} after the call.
-- Errors: NOT_FOUND (no lease), FAILED_PRECONDITION (another holder).
-- Invariants: a lease past its expiry is expired now (its sample re-pooled) instead of renewed; a lease
-- that is not active is returned unchanged.

local lid = ARGV[2]
local L = hmap(k('l:' .. lid))
if L.gid == nil then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
if L.holder ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION lease ' .. lid .. ' is held by ' .. L.holder)
end
if L.st == tostring(ACTIVE) then
  if NOW > tonumber(L.exp) then
    expire_lease(lid, L)
  else
    local exp = NOW + ttl_now()
    redis.call('HSET', k('l:' .. lid), 'exp', int(exp))
    redis.call('ZADD', k('active'), exp, lid)
  end
end
return finish(lease_row(lid))
