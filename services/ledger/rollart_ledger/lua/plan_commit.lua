-- plan_commit.lua: the write half of PlanStep (planning.py reads and decides; this installs the plan).
-- Called inside MULTI after WATCH, so the plan is installed only if nothing it was computed from changed.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- Installs a plan atomically: pending policy, current step and version, per-actor quotas, tau updates,
-- commands, then cancels active leases outside the new staleness window.
-- ARGV[2] step, ARGV[3] v, ARGV[4] B, ARGV[5] StepPlan blob, then
--   nq, (actor, quota)*          quotas (0 is not written)
--   nt, (actor, tau, excluded)*  tau and excluded-steps updates
--   nc, (target, kinds, ack, LedgerCommand blob)*   commands, in order (Commit(v) before StepPlanned)
-- Returns the number of leases cancelled as STALE (v_j < v - alpha); their samples go back to the pool.
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
  redis.call('HSET', k('a:' .. ARGV[i]), 'tau', ARGV[i + 1], 'excl', ARGV[i + 2])
  i = i + 3
end
local nc = tonumber(ARGV[i]); i = i + 1
for _ = 1, nc do
  cmd_push(ARGV[i], ARGV[i + 1], ARGV[i + 2], {'c', ARGV[i + 3]})
  i = i + 4
end
local floor = v - pol('alpha')
local stale = 0
for _, lid in ipairs(redis.call('ZRANGE', k('active'), 0, -1)) do
  local L = hmap(k('l:' .. lid))
  if L.st == tostring(ACTIVE) and tonumber(L.ver) < floor then
    cancel_lease(lid, L, C_STALE)
    slot_return(L.gid, L.idx)
    stale = stale + 1
  end
end
return finish(stale)
