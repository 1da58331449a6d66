-- submit_batch.lua: SubmitBatch. Settles each result with submit.lua's logic (submit_one) in turn, in one script
-- run: one round trip, one AOF write and fsync for the whole batch.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] n results, then per result: its argument count c, then c arguments laid out as submit.lua's ARGV[2..].
-- Returns one reply per result, in order: {1, submit.lua's reply} or {0, 'CODE message'} (the result was
-- refused, e.g. ALREADY_EXISTS, as submit.lua would refuse it, and changed nothing).
-- Invariants: each result is settled on its own, exactly as submit.lua settles it (idempotent per lease and
-- trajectory, the first verdict stands), seeing the state the results before it left; a refused result does
-- not stop the others; the results share Redis's clock (one TIME).

return run_batch(submit_one)
