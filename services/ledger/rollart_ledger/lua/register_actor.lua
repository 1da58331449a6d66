-- register_actor.lua: RegisterActor. A re-registration keeps tau and the settled tokens.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] actor id, ARGV[3] declared info (LedgerActor blob), ARGV[4] ActorWeightState blob, ARGV[5]
-- region, ARGV[6] relay id.
-- Returns the actor's hash P a:<actor> (HGETALL, flat).
-- Invariants: a registered actor is alive, not draining, with a fresh heartbeat; P actors lists it.

local ak = k('a:' .. ARGV[2])
if redis.call('EXISTS', ak) == 0 then
  redis.call('HSET', ak, 'tau', f17(pol('tau0')), 'obs', 0, 'tok', 0, 'excl', 0, 'wt', 0, 'ws', 0)
end
redis.call('HSET', ak, 'info', ARGV[3], 'w', ARGV[4], 'region', ARGV[5], 'relay', ARGV[6],
  'live', 1, 'hb', int(NOW), 'reg', int(NOW), 'drain', 0, 'infl', 0)
redis.call('SADD', k('actors'), ARGV[2])
actors_changed()
return redis.call('HGETALL', ak)
