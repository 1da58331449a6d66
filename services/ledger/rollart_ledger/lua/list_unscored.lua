-- list_unscored.lua: ListUnscored. The admitted samples awaiting their reward, settled under a holder prefix.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] holder prefix ('' any), ARGV[3] most samples, ARGV[4] most trajectory bytes (a page ends once past
-- them), ARGV[5] and ARGV[6] the admission ms and trajectory id the page before ended on ('' '': from the start).
-- Returns {more, admission ms, trajectory id, {{trajectory id, admitted at ms, lease row, trajectory blob}, ...}}:
-- oldest admission first (then by trajectory id, the index's order); more = 1 when the index goes on after the
-- sample named, the last one this page looked at.
-- Invariants: reads only; looks at 10000 samples of P unscored at most.

local prefix, max, budget = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local after, last, from = nil, ARGV[6], '-inf'
if ARGV[5] ~= '' then after, from = tonumber(ARGV[5]), ARGV[5] end
local out, bytes, more, at_ms, at_tid = {}, 0, 0, ARGV[5], ARGV[6]
local ids = redis.call('ZRANGEBYSCORE', k('unscored'), from, '+inf', 'WITHSCORES', 'LIMIT', 0, 10000)
for i = 1, #ids, 2 do
  local tid, at = ids[i], ids[i + 1]
  if after == nil or tonumber(at) > after or tid > last then
    if #out >= max or bytes >= budget then
      more = 1
      break
    end
    at_ms, at_tid = at, tid
    local r = redis.call('HMGET', k('s:' .. tid), 'lease', 'scd')
    if r[1] and r[2] == '0' then
      local holder = redis.call('HGET', k('l:' .. r[1]), 'holder')
      if holder and string.sub(holder, 1, #prefix) == prefix then
        local blob = redis.call('HGET', k('s:' .. tid), 'blob') or ''
        bytes = bytes + #blob
        out[#out + 1] = {tid, at, lease_row(r[1]), blob}
      end
    end
  end
end
if #ids == 20000 then more = 1 end  -- the scan's bound: the index goes on
return {more, at_ms, at_tid, out}
