-- heartbeat.lua: ActorHeartbeat.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] actor id, ARGV[3] weights blob ('' keeps), ARGV[4] observed tokens/s (0: none), ARGV[5]
-- in-flight requests, ARGV[6] draining '1'/'0', ARGV[7] relay id ('' keeps).
-- Returns {status, tau, latest command sequence for it}; status 'ok', 'unknown' (never registered,
-- dead or departed: nothing changes) or 'dead' (silent past the policy's actor timeout: presumed dead now,
-- its leases returned to the pool).
-- Invariants: a dead or departed actor must register again; a heartbeat never revives it.
-- P aepoch (what PlanStep watches) moves only when draining, weights or relay change, or the actor is found dead.

local aid = ARGV[2]
local ak = k('a:' .. aid)
local r = redis.call('HMGET', ak, 'live', 'hb', 'w', 'relay')
if r[1] == false or r[1] == '3' or r[1] == '4' then return {'unknown', '0', 0} end
if tonumber(r[2]) + pol('tout') < NOW then
  actor_gone(aid, 3, 2)
  return finish({'dead', '0', 0})
end
local live = 1
if ARGV[6] == '1' then live = 2 end
if r[1] ~= tostring(live) or (ARGV[3] ~= '' and ARGV[3] ~= r[3]) or (ARGV[7] ~= '' and ARGV[7] ~= r[4]) then
  actors_changed()  -- draining, weights or relay changed: a plan read before is stale (a plain heartbeat is not)
end
redis.call('HSET', ak, 'hb', int(NOW), 'infl', ARGV[5], 'drain', ARGV[6], 'live', live)
if ARGV[3] ~= '' then redis.call('HSET', ak, 'w', ARGV[3]) end
if ARGV[7] ~= '' then redis.call('HSET', ak, 'relay', ARGV[7]) end
local obs = tonumber(ARGV[4])
local tau
if obs > 0 then tau = tau_observe(ak, obs) else tau = tn(redis.call('HGET', ak, 'tau'), pol('tau0')) end
local last = redis.call('HMGET', k('cmd:last'), 't:' .. aid, 'k:1', '*')
local seq = math.max(tn(last[1], 0), tn(last[2], 0), tn(last[3], 0))
return {'ok', f17(tau), seq}
