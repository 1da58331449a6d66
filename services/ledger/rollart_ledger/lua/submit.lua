-- submit.lua: Submit. Settles one result for lease j: the admission rules of docs/ledger.md, in order.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV: 1 now, 2 lease, 3 trajectory, 4 holder, 5 claimed lease version, 6 status ok, 7 has tokens, 8 min
-- version, 9 max version, 10 scored, 11 reward, 12 trajectory blob, 13 tau window ms, 14 nh, (v, hash)*,
-- nw, (actor, tokens, generation ms)*, then the trajectory's generated (action) tokens.
-- Returns {admitted, reason, detail, duplicate, group complete, group admitted, awaiting reward, lease row};
-- reason is a RejectionReason number (0 when admitted); lease row is false for an unknown lease.
-- Errors: ALREADY_EXISTS when the trajectory id was submitted for another lease (nothing changes).
-- Invariants: settlement is idempotent per (lease, trajectory): the first verdict is stored in P vd:<lease>
-- and returned again with duplicate = 1, counted once; WRONG_HOLDER changes nothing; a rejected lease
-- re-pools its slot; a group reaching G admitted samples is complete and its other leases are cancelled
-- (GROUP_COMPLETE) with their holders told in the same step; an admitted sample without its reward is
-- indexed in P unscored (by admission time) until RecordReward scores or fails it or it leaves the buffer.

return submit_one(ARGV)
