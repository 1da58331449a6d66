-- cancel.lua: CancelLeases by id and by group.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] CancelReason number, ARGV[3] nids, ids..., then ngroups, groups...
-- Returns the ids of the leases moved to CANCELLED (final leases are skipped).
-- Errors: NOT_FOUND when any lease or group is unknown (checked before any write).
-- Invariants: STALE re-pools the slot, any other reason closes it (a group that can no longer reach G is
-- dropped); holders get a CancelLeases command in the same step (finish).

local reason = tonumber(ARGV[2])
local nids = tonumber(ARGV[3])
local ids, gids = {}, {}
for i = 1, nids do ids[i] = ARGV[3 + i] end
local ng = tonumber(ARGV[4 + nids])
for i = 1, ng do gids[i] = ARGV[4 + nids + i] end
for _, lid in ipairs(ids) do
  if redis.call('EXISTS', k('l:' .. lid)) == 0 then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
end
for _, gid in ipairs(gids) do
  if redis.call('EXISTS', k('g:' .. gid)) == 0 then return redis.error_reply('NOT_FOUND no group ' .. gid) end
end
local function cancel_one(lid)
  local L = hmap(k('l:' .. lid))
  if L.st ~= tostring(ACTIVE) then return end
  cancel_lease(lid, L, reason)
  if reason == C_STALE then slot_return(L.gid, L.idx) else slot_close(L.gid, L.idx) end
end
for _, lid in ipairs(ids) do cancel_one(lid) end
for _, gid in ipairs(gids) do
  local G = gload(gid)
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'L' then cancel_one(string.sub(s, 3)) end
  end
end
local out = {}
for i, lid in ipairs(CANCELLED_IDS) do out[i] = lid end
return finish(out)
