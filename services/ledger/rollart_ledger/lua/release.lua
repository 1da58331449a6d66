-- release.lua: ReleaseLease. The holder gives a lease back; its sample returns to the pool at once.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] lease id, ARGV[3] holder, ARGV[4] ReleaseReason number, ARGV[5] tokens generated for the abandoned
-- trajectory ('' when not reported).
-- Returns {1 if the lease changed state else 0, lease row}.
-- Errors: NOT_FOUND (no lease), FAILED_PRECONDITION (another holder).
-- Invariants: a lease past its expiry ends EXPIRED, not RELEASED; a final lease is left as it is. Reported
-- tokens are counted once per lease (cancelled, or failed for INFRA_FAILURE / TIMEOUT), also for a lease
-- the ledger had cancelled or expired, never for one that was submitted.

local lid = ARGV[2]
local L = hmap(k('l:' .. lid))
if L.gid == nil then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
if L.holder ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION lease ' .. lid .. ' is held by ' .. L.holder)
end
local changed = 0
if L.st == tostring(ACTIVE) then
  if NOW > tonumber(L.exp) then
    expire_lease(lid, L)
  else
    lease_close(lid, L, RELEASED)
    redis.call('HSET', k('l:' .. lid), 'rel', ARGV[4])
    slot_return(L.gid, L.idx)
  end
  changed = 1
end
if ARGV[5] ~= nil and ARGV[5] ~= '' and L.st ~= tostring(SETTLED) and L.st ~= tostring(REJECTED) and
    redis.call('HSETNX', k('l:' .. lid), 'acct', 1) == 1 then
  local fate = 'cancelled'
  if ARGV[4] == '2' or ARGV[4] == '3' then fate = 'failed' end
  acct_add(fate, tonumber(ARGV[5]))
end
return finish({changed, lease_row(lid)})
