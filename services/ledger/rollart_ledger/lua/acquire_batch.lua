-- acquire_batch.lua: AcquireLeasesBatch. Runs acquire.lua's logic (acquire_one) for each request in turn, in one
-- script run: one round trip, one AOF write and fsync for the whole batch.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] n requests, then per request: its argument count c, then c arguments laid out as acquire.lua's ARGV[2..].
-- Returns one reply per request, in order: {1, acquire.lua's reply} or {0, 'CODE message'} (the request was
-- refused, as acquire.lua would refuse it, and changed nothing).
-- Invariants: each request sees the state the requests before it left (as the same calls made one after the
-- other would); a refused request does not stop the others; the requests share Redis's clock (one TIME).

-- One view of the pool head serves the requests (acquire_one): it scans the largest request's chunk plus the
-- slots all of them may take, so each request sees the head of the pool as it would after the ones before.
local widest, total, p = 0, 0, 3
for _ = 1, tonumber(ARGV[2]) do
  local max = tonumber(ARGV[p + 2])
  widest, total = math.max(widest, acquire_chunk(max)), total + max
  p = p + tonumber(ARGV[p]) + 1
end
local scan = widest + total
return run_batch(function(A, V) return acquire_one(A, V, scan) end)
