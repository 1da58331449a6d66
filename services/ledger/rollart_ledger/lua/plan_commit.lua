-- plan_commit.lua: the write half of PlanStep (planning.py reads and decides; this installs the plan).
-- Called inside MULTI after WATCH, so the plan is installed only if nothing it was computed from changed.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- Installs a plan atomically: pending policy, current step and version, per-actor quotas, tau updates,
-- commands, then cancels active leases outside the new staleness window.
-- ARGV[2] step, ARGV[3] v, ARGV[4] B, ARGV[5] StepPlan blob, then
--   nq, (actor, quota)*          quotas (0 is not written)
--   nt, (actor, tau, excluded, seen)*  tau and excluded-steps updates; seen: the tau the plan read ('' none):
--                                when the stored tau moved since (tau is not watched), it is scaled by tau / seen
--   nc, (target, kinds, ack, LedgerCommand blob)*   commands, in order (Commit(v) before StepPlanned)
-- Returns the number of leases cancelled as STALE (v_j below the next batch's floor, next_floor(v); none under
-- AT_START); their samples go back to the pool, and buffered samples below that floor are evicted (counted
-- in P stats evicted).
-- Invariants: P pol:next, when present, becomes P pol first, so the step is judged by one policy.

if redis.call('EXISTS', k('pol:next')) == 1 then
  redis.call('RENAME', k('pol:next'), k('pol'))
  POL = nil
  ttl_recompute()
end
local step, v = ARGV[2], tonumber(ARGV[3])
redis.call('SET', k('plan:' .. step), ARGV[5])
redis.call('ZADD', k('plans'), step, step)
redis.call('HSET', k('cur'), 'step', step, 'v', ARGV[3], 'B', ARGV[4])
redis.call('DEL', k('quota'))
local i = 6
local nq = tonumber(ARGV[i]); i = i + 1
for _ = 1, nq do
  if tonumber(ARGV[i + 1]) > 0 then redis.call('HSET', k('quota'), ARGV[i], ARGV[i + 1]) end
  i = i + 2
end
local nt = tonumber(ARGV[i]); i = i + 1
for _ = 1, nt do
  local ak, tau, seen = k('a:' .. ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 3])
  if seen ~= nil and seen > 0 then
    local stored = tonumber(redis.call('HGET', ak, 'tau'))
    if stored ~= nil and stored ~= seen then tau = f17(stored * tonumber(tau) / seen) end
  end
  redis.call('HSET', ak, 'tau', tau, 'excl', ARGV[i + 2])
  i = i + 4
end
local nc = tonumber(ARGV[i]); i = i + 1
for _ = 1, nc do
  cmd_push(ARGV[i], ARGV[i + 1], ARGV[i + 2], {'c', ARGV[i + 3]})
  i = i + 4
end
-- Work that the next batch could not take is stopped now, not at that GetBatch: active leases that started
-- below its floor are cancelled (STALE) and buffered samples below it evicted, their slots re-pooled to be
-- leased at v at once (started groups first). The floor is v - alpha, or v + 1 - alpha once the planned
-- step's batch is formed (asynchronous: that batch is trained while this version's work is generated).
local floor = next_floor(v)
local stale = 0
if pol('adm') ~= AT_START then  -- AReaL: only the start of a trajectory is bounded
  for _, lid in ipairs(redis.call('ZRANGE', k('active'), 0, -1)) do
    local L = hmap(k('l:' .. lid))
    if L.st == tostring(ACTIVE) and tonumber(L.ver) < floor then
      cancel_lease(lid, L, C_STALE)
      slot_return(L.gid, L.idx)
      stale = stale + 1
    end
  end
  evict_below(floor)
end
return finish(stale)
