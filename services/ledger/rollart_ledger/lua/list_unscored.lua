-- list_unscored.lua: ListUnscored. The admitted samples awaiting their reward, settled under a holder prefix.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] holder prefix ('' any), ARGV[3] most samples.
-- Returns {{trajectory id, admitted at ms, lease row, trajectory blob}, ...}, oldest admission first.
-- Invariants: reads only; looks at the first 10000 samples of P unscored at most.

local prefix, max = ARGV[2], tonumber(ARGV[3])
local out = {}
local ids = redis.call('ZRANGE', k('unscored'), 0, 9999, 'WITHSCORES')
for i = 1, #ids, 2 do
  if #out >= max then break end
  local tid = ids[i]
  local r = redis.call('HMGET', k('s:' .. tid), 'lease', 'scd')
  if r[1] and r[2] == '0' then
    local holder = redis.call('HGET', k('l:' .. r[1]), 'holder')
    if holder and string.sub(holder, 1, #prefix) == prefix then
      out[#out + 1] = {tid, ids[i + 1], lease_row(r[1]), redis.call('HGET', k('s:' .. tid), 'blob') or ''}
    end
  end
end
return out
