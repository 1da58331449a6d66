-- acquire.lua: AcquireLeases. Expires due leases, then leases pending slots in pool order.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] holder, ARGV[3] max leases, ARGV[4] holder's region, ARGV[5] group filter (''), ARGV[6] ntasks,
-- ARGV[7..] tasks.
-- Returns {status, lease rows...}; status 'ok' (at least one lease), 'noversion' (no version registered
-- yet) or 'empty'. A lease row is {HGETALL of P l:<lease>, prompt blob, h(v_j)}.
-- Errors: NOT_FOUND for an unknown group filter.
-- Invariants: v_j = n (the latest version before any plan); a new group starts only while the samples of
-- started groups not yet in a batch fit the capacity (back-pressure, below), while samples of started groups
-- are leased first (the group closest to complete first) unless the window is closed; a lease is assigned
-- to the plan's actor with the most quota left, same region first.

local reply = acquire_one(ARGV)
return reply
