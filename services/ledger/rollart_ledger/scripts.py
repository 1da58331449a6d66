"""Lua scripts that make every ledger state change one atomic step in Redis.

Each script is ``LIB`` followed by its body. KEYS[1] is the key prefix, ARGV[1] the caller's clock in ms;
the scripts read time from Redis (TIME) so that timestamps follow their order of execution.
Scripts check everything that can fail before their first write, so a rejected call (``redis.error_reply``,
mapped to a gRPC status by the service) changes nothing. docs/ledger.md describes the keys.
"""

from __future__ import annotations

from .policy import DEFAULTS

_DEFAULTS_LUA = "{" + ", ".join(f"{k} = {v!r}" for k, v in DEFAULTS.items()) + "}"

LIB = r"""
local P = KEYS[1]
-- Redis's clock, not the caller's: timestamps then follow the order in which scripts ran, even when
-- concurrent handlers read their clocks in another order (ARGV[1], the caller's clock, is for logs).
local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local function k(s) return P .. s end
local function hmap(key)
  local r = redis.call('HGETALL', key)
  local m = {}
  for i = 1, #r, 2 do m[r[i]] = r[i + 1] end
  return m
end
local function tn(x, d)
  if x == nil or x == false or x == '' then return d end
  return tonumber(x)
end
local function f17(x) return string.format('%.17g', x) end
local function int(x) return string.format('%.0f', x) end

local DEF = __DEFAULTS__
local POL = nil
local function pol(f)
  if POL == nil then POL = hmap(k('pol')) end
  local v = POL[f]
  if v == nil then return DEF[f] end
  return tonumber(v)
end

-- lease states, rejection and cancel reasons, subscriber kinds (the proto enums' numbers)
local ACTIVE, SETTLED, REJECTED, EXPIRED, CANCELLED, RELEASED = 1, 2, 3, 4, 5, 6
local C_COMPLETE, C_MANUAL, C_STALE, C_DROPPED = 1, 2, 3, 4
local HOLDER = 3

local function ttl_now() return tn(redis.call('GET', k('ttl')), pol('ttl0')) end
local function ttl_recompute()
  local xs = redis.call('LRANGE', k('ct'), 0, -1)
  if #xs == 0 then
    redis.call('SET', k('ttl'), int(pol('ttl0')))
    redis.call('DEL', k('med'))
    return
  end
  local t = {}
  for i, x in ipairs(xs) do t[i] = tonumber(x) end
  table.sort(t)
  local n = #t
  local med
  if n % 2 == 1 then med = t[(n + 1) / 2] else med = (t[n / 2] + t[n / 2 + 1]) / 2 end
  local ttl = math.max(pol('tmin'), math.min(pol('tmax'), pol('mult') * med))
  redis.call('SET', k('med'), int(med))
  redis.call('SET', k('ttl'), int(ttl))
end

-- ------------------------------------------------------------------------------------------ commands
local function cmd_push(target, kinds, ack, fields)
  local seq = redis.call('INCR', k('cmd:seq'))
  local args = {'XADD', k('cmds'), seq .. '-1', 't', target, 'k', kinds, 'a', ack, 'ts', int(NOW)}
  for i = 1, #fields do args[#args + 1] = fields[i] end
  redis.call(unpack(args))
  local last = k('cmd:last')
  if target ~= '' then
    redis.call('HSET', last, 't:' .. target, seq)
  elseif kinds == '' then
    redis.call('HSET', last, '*', seq)
  else
    for kd in string.gmatch(kinds, '[^,]+') do redis.call('HSET', last, 'k:' .. kd, seq) end
  end
  return seq
end

local CANCELS, CANCEL_ORDER, CANCELLED_IDS = {}, {}, {}
local function note_cancel(holder, reason, lid)
  local key = holder .. '|' .. reason
  if CANCELS[key] == nil then
    CANCELS[key] = {}
    CANCEL_ORDER[#CANCEL_ORDER + 1] = key
  end
  table.insert(CANCELS[key], lid)
  CANCELLED_IDS[#CANCELLED_IDS + 1] = lid
end
-- Every script ends through finish(): holders learn of the leases it cancelled in the same atomic step.
local function finish(result)
  for _, key in ipairs(CANCEL_ORDER) do
    local holder, reason = string.match(key, '^(.*)|(%d+)$')
    cmd_push(holder, tostring(HOLDER), '0',
      {'x', 'cancel', 'ids', table.concat(CANCELS[key], ','), 'r', reason})
  end
  CANCELS, CANCEL_ORDER = {}, {}
  return result
end

-- ------------------------------------------------------------------------------------------ groups
local function gload(gid)
  local G = hmap(k('g:' .. gid))
  if G.st == nil then return nil end
  G.G, G.n, G.adm, G.scd = tonumber(G.G), tonumber(G.n), tonumber(G.adm), tonumber(G.scd)
  return G
end
local function member(gid, idx) return gid .. '|' .. idx end
local function slot_set(gid, G, idx, s)
  redis.call('HSET', k('g:' .. gid), 's' .. idx, s)
  G['s' .. idx] = s
end
local function pool_add(gid, G, idx)
  redis.call('ZADD', k('pool'), G.sc, member(gid, idx))
  redis.call('ZADD', k('pool:t:' .. G.task), G.sc, member(gid, idx))
  slot_set(gid, G, idx, 'P')
end
local function pool_rem(gid, G, idx)
  redis.call('ZREM', k('pool'), member(gid, idx))
  redis.call('ZREM', k('pool:t:' .. G.task), member(gid, idx))
end
local function ready_update(gid, G)
  if G.st == 'C' and G.scd >= G.G then
    if redis.call('ZSCORE', k('ready'), gid) == false then
      redis.call('ZADD', k('ready'), redis.call('INCR', k('ready:seq')), gid)
      redis.call('INCRBY', k('ready:n'), G.G)
    end
  elseif redis.call('ZREM', k('ready'), gid) == 1 then
    redis.call('DECRBY', k('ready:n'), G.G)
  end
end
local function group_end(gid, st)
  redis.call('HSET', k('g:' .. gid), 'st', st, 'end', int(NOW))
  redis.call('ZADD', k('gended'), NOW, gid)
end

-- ------------------------------------------------------------------------------------------ leases
local function lease_close(lid, L, st)
  redis.call('HSET', k('l:' .. lid), 'st', st, 'end', int(NOW))
  redis.call('ZREM', k('active'), lid)
  redis.call('SREM', k('h:' .. L.holder), lid)
  if L.as ~= nil and L.as ~= '' then redis.call('SREM', k('as:' .. L.as), lid) end
  redis.call('HINCRBY', k('cnt'), tostring(ACTIVE), -1)
  redis.call('HINCRBY', k('cnt'), tostring(st), 1)
  redis.call('ZADD', k('ended'), NOW, lid)
  L.st = tostring(st)
end
local function cancel_lease(lid, L, reason)
  lease_close(lid, L, CANCELLED)
  redis.call('HSET', k('l:' .. lid), 'can', reason)
  note_cancel(L.holder, reason, lid)
end

-- ------------------------------------------------------------------------------------------ samples
local function sample_remove(tid, mark)
  local sk = k('s:' .. tid)
  local r = redis.call('HMGET', sk, 'scd', 'res', 'lease')
  if redis.call('DEL', sk) == 0 then return false end
  redis.call('ZREM', k('buf:byver'), tid)
  redis.call('DECR', k('buf:n'))
  if r[1] == '1' then redis.call('DECR', k('buf:scored')) end
  if r[2] == '1' then redis.call('DECR', k('buf:reserved')) end
  redis.call('HSET', k('trj'), tid, mark .. ':' .. (r[3] or ''))
  return true
end

local function drop_group(gid, G)
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    local c = string.sub(s, 1, 1)
    if c == 'P' then
      pool_rem(gid, G, i)
    elseif c == 'L' then
      local lid = string.sub(s, 3)
      local L = hmap(k('l:' .. lid))
      if L.st == tostring(ACTIVE) then cancel_lease(lid, L, C_DROPPED) end
    elseif c == 'D' then
      sample_remove(string.sub(s, 3), 'E')
    end
    slot_set(gid, G, i, 'X')
  end
  G.st = 'D'
  ready_update(gid, G)
  redis.call('HSET', k('g:' .. gid), 'adm', 0, 'scd', 0)
  group_end(gid, 'D')
  redis.call('SREM', k('gopen'), gid)
  if G.started == '1' then redis.call('DECRBY', k('inflight'), G.G) end
  redis.call('HINCRBY', k('stats'), 'dropped', 1)
end

-- A group that can no longer reach G admitted samples (slots closed after too many attempts) is dropped.
local function check_drop(gid, G)
  if G.st ~= 'O' then return false end
  local possible = G.adm
  for i = 0, G.n - 1 do
    local c = string.sub(G['s' .. i] or 'X', 1, 1)
    if c == 'P' or c == 'L' then possible = possible + 1 end
  end
  if possible >= G.G then return false end
  drop_group(gid, G)
  return true
end

-- A slot whose lease ended without an admitted result goes back to the pool (or closes after maxatt).
local function slot_return(gid, idx)
  local G = gload(gid)
  if G == nil then return end
  if G.st ~= 'O' then
    slot_set(gid, G, idx, 'X')
    return
  end
  if tn(G['a' .. idx], 0) >= pol('maxatt') then
    slot_set(gid, G, idx, 'X')
    check_drop(gid, G)
  else
    pool_add(gid, G, idx)
  end
end
local function slot_close(gid, idx)
  local G = gload(gid)
  if G == nil then return end
  slot_set(gid, G, idx, 'X')
  check_drop(gid, G)
end

local function expire_lease(lid, L)
  lease_close(lid, L, EXPIRED)
  slot_return(L.gid, L.idx)
end
local function expire_due(limit)
  local due = redis.call('ZRANGEBYSCORE', k('active'), '-inf', '(' .. int(NOW), 'LIMIT', 0, limit)
  for _, lid in ipairs(due) do
    local L = hmap(k('l:' .. lid))
    if L.st == tostring(ACTIVE) then expire_lease(lid, L) else redis.call('ZREM', k('active'), lid) end
  end
  return #due
end

-- An admitted sample leaves the buffer without being trained on (stale, or scoring failed): its slot is
-- leased again, and a complete group opens again.
local function unadmit(tid, mark)
  local S = hmap(k('s:' .. tid))
  if S.gid == nil then return false end
  sample_remove(tid, mark)
  local G = gload(S.gid)
  if G == nil then return true end
  G.adm = redis.call('HINCRBY', k('g:' .. S.gid), 'adm', -1)
  if S.scd == '1' then G.scd = redis.call('HINCRBY', k('g:' .. S.gid), 'scd', -1) end
  if G.st == 'C' then
    G.st = 'O'
    redis.call('HSET', k('g:' .. S.gid), 'st', 'O')
    redis.call('SADD', k('gopen'), S.gid)
  end
  ready_update(S.gid, G)
  slot_set(S.gid, G, S.idx, 'X')
  slot_return(S.gid, S.idx)
  return true
end

-- ------------------------------------------------------------------------------------------ actors
local function tau_observe(ak, obs)
  local r = redis.call('HMGET', ak, 'tau', 'obs')
  local n = tn(r[2], 0)
  local tau
  if n == 0 then tau = obs else
    local w = pol('w')
    tau = (1 - w) * tn(r[1], pol('tau0')) + w * obs
  end
  redis.call('HSET', ak, 'tau', f17(tau), 'obs', n + 1)
  return tau
end

-- An actor that left or was presumed dead: the leases it holds go back to the pool, the leases assigned to
-- it lose the assignment, and its share of the step's quota is dropped.
local function actor_gone(aid, live, release_reason)
  local ak = k('a:' .. aid)
  redis.call('HSET', ak, 'live', live)
  local returned, unassigned = 0, 0
  for _, lid in ipairs(redis.call('SMEMBERS', k('h:' .. aid))) do
    local L = hmap(k('l:' .. lid))
    if L.st == tostring(ACTIVE) then
      lease_close(lid, L, RELEASED)
      redis.call('HSET', k('l:' .. lid), 'rel', release_reason)
      slot_return(L.gid, L.idx)
      returned = returned + 1
    end
  end
  for _, lid in ipairs(redis.call('SMEMBERS', k('as:' .. aid))) do
    redis.call('HSET', k('l:' .. lid), 'as', '')
    unassigned = unassigned + 1
  end
  redis.call('DEL', k('as:' .. aid))
  redis.call('HDEL', k('quota'), aid)
  return returned, unassigned
end

local function lease_row(lid)
  local L = redis.call('HGETALL', k('l:' .. lid))
  local m = {}
  for i = 1, #L, 2 do m[L[i]] = L[i + 1] end
  local prompt = redis.call('HGET', k('g:' .. (m.gid or '')), 'prompt') or ''
  local vh = redis.call('HGET', k('vhash'), m.ver or '') or ''
  return {L, prompt, vh}
end
"""

SCRIPTS: dict[str, str] = {}

# ------------------------------------------------------------------------------------------------ policy
# ARGV: now, job_id, blob, apply_now ('1' when no step was planned yet), then field, value pairs.
SCRIPTS["set_policy"] = r"""
local job = redis.call('GET', k('job'))
if job and job ~= ARGV[2] then
  return redis.error_reply('FAILED_PRECONDITION this ledger serves job ' .. job .. ', not ' .. ARGV[2])
end
redis.call('SET', k('job'), ARGV[2])
redis.call('SET', k('policy'), ARGV[3])
local target = 'pol:next'
if redis.call('EXISTS', k('cur')) == 0 then target = 'pol' end
redis.call('DEL', k(target))
redis.call('HSET', k(target), 'blob', ARGV[3])
for i = 5, #ARGV, 2 do redis.call('HSET', k(target), ARGV[i], ARGV[i + 1]) end
if target == 'pol' then
  POL = nil
  ttl_recompute()
end
return target
"""

# Writes the default policy fields once, so that every script reads the same numbers.
# ARGV: now, blob, then field, value pairs.
SCRIPTS["ensure_policy"] = r"""
if redis.call('EXISTS', k('pol')) == 1 then return 0 end
redis.call('HSET', k('pol'), 'blob', ARGV[2])
for i = 3, #ARGV, 2 do redis.call('HSET', k('pol'), ARGV[i], ARGV[i + 1]) end
POL = nil
ttl_recompute()
return 1
"""

# ------------------------------------------------------------------------------------------------ versions
# ARGV: now, v, base, hash, blob, published-command blob. Returns {created, recorded blob}.
SCRIPTS["register_version"] = r"""
local v = tonumber(ARGV[2])
local base = tonumber(ARGV[3])
local existing = redis.call('HGET', k('versions'), ARGV[2])
if existing then return {0, existing} end
local latest = tn(redis.call('GET', k('latest')), -1)
if v <= latest then
  return redis.error_reply('FAILED_PRECONDITION version ' .. v .. ' is not greater than the latest (' ..
    latest .. '); versions are append-only and monotone')
end
if base >= 0 and redis.call('HEXISTS', k('versions'), ARGV[3]) == 0 then
  return redis.error_reply('FAILED_PRECONDITION base version ' .. base .. ' is not registered')
end
redis.call('HSET', k('versions'), ARGV[2], ARGV[5])
redis.call('HSET', k('vhash'), ARGV[2], ARGV[4])
redis.call('ZADD', k('vers'), v, ARGV[2])
redis.call('SET', k('latest'), ARGV[2])
cmd_push('', '2,1', '0', {'c', ARGV[6]})
return finish({1, ARGV[5]})
"""

# ------------------------------------------------------------------------------------------------ actors
# ARGV: now, actor_id, info blob, weights blob, region, relay. Returns the actor's hash.
SCRIPTS["register_actor"] = r"""
local ak = k('a:' .. ARGV[2])
if redis.call('EXISTS', ak) == 0 then
  redis.call('HSET', ak, 'tau', f17(pol('tau0')), 'obs', 0, 'tok', 0, 'excl', 0, 'wt', 0, 'ws', 0)
end
redis.call('HSET', ak, 'info', ARGV[3], 'w', ARGV[4], 'region', ARGV[5], 'relay', ARGV[6],
  'live', 1, 'hb', int(NOW), 'reg', int(NOW), 'drain', 0, 'infl', 0)
redis.call('SADD', k('actors'), ARGV[2])
return redis.call('HGETALL', ak)
"""

# ARGV: now, actor_id, weights blob ('' keeps), observed tok/s, in-flight, draining, relay ('' keeps).
# Returns {status, tau, latest command sequence}; status 'ok', 'unknown' or 'dead'.
SCRIPTS["heartbeat"] = r"""
local aid = ARGV[2]
local ak = k('a:' .. aid)
local r = redis.call('HMGET', ak, 'live', 'hb')
if r[1] == false or r[1] == '3' or r[1] == '4' then return {'unknown', '0', 0} end
if tonumber(r[2]) + pol('tout') < NOW then
  actor_gone(aid, 3, 2)
  return finish({'dead', '0', 0})
end
local live = 1
if ARGV[6] == '1' then live = 2 end
redis.call('HSET', ak, 'hb', int(NOW), 'infl', ARGV[5], 'drain', ARGV[6], 'live', live)
if ARGV[3] ~= '' then redis.call('HSET', ak, 'w', ARGV[3]) end
if ARGV[7] ~= '' then redis.call('HSET', ak, 'relay', ARGV[7]) end
local obs = tonumber(ARGV[4])
local tau
if obs > 0 then tau = tau_observe(ak, obs) else tau = tn(redis.call('HGET', ak, 'tau'), pol('tau0')) end
local last = redis.call('HMGET', k('cmd:last'), 't:' .. aid, 'k:1', '*')
local seq = math.max(tn(last[1], 0), tn(last[2], 0), tn(last[3], 0))
return {'ok', f17(tau), seq}
"""

# ARGV: now, actor_id. Returns {status, leases returned, leases unassigned}.
SCRIPTS["leave_actor"] = r"""
local ak = k('a:' .. ARGV[2])
local live = redis.call('HGET', ak, 'live')
if live == false then return redis.error_reply('NOT_FOUND no actor ' .. ARGV[2]) end
if live == '4' then return {0, 0} end
local returned, unassigned = actor_gone(ARGV[2], 4, 4)
redis.call('HSET', ak, 'hb', int(NOW))
return finish({returned, unassigned})
"""

# ------------------------------------------------------------------------------------------------ commands
# ARGV: now, n, then n x (target, kinds, ack, blob). Returns the sequences.
SCRIPTS["push_commands"] = r"""
local n = tonumber(ARGV[2])
local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 4
  out[#out + 1] = cmd_push(ARGV[b], ARGV[b + 1], ARGV[b + 2], {'c', ARGV[b + 3]})
end
return out
"""

# ARGV: now, subscriber, sequence, ok, error, commit order id ('' if none), weights blob ('' if none).
SCRIPTS["ack_command"] = r"""
local field = ARGV[2] .. ':' .. ARGV[3]
if redis.call('HSETNX', k('acks'), field, ARGV[4] .. '|' .. ARGV[5]) == 0 then return 0 end
if ARGV[6] ~= '' then
  local state = 'ok'
  if ARGV[4] ~= '1' then state = 'err:' .. ARGV[5] end
  redis.call('HSET', k('commit'), ARGV[6], state)
end
if ARGV[7] ~= '' and redis.call('EXISTS', k('a:' .. ARGV[2])) == 1 then
  redis.call('HSET', k('a:' .. ARGV[2]), 'w', ARGV[7])
end
return 1
"""

# ------------------------------------------------------------------------------------------------ planning
# Installs a plan atomically (called inside MULTI after WATCH): pending policy, current step and version,
# per-actor quotas, tau updates, commands, then cancels active leases outside the new staleness window.
# ARGV: now, step, v, B, plan blob, nq, (actor, quota)*, nt, (actor, tau, excluded_steps)*, nc,
#       (target, kinds, ack, blob)*
SCRIPTS["plan_commit"] = r"""
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
"""

# ------------------------------------------------------------------------------------------------ pool
# ARGV: now, G, R, step, priority, n, then n x (group id or '', prompt id, task, prompt blob).
# Returns {group ids..., created, samples}.
SCRIPTS["add_prompts"] = r"""
local G, R, step = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local prio, n = tonumber(ARGV[5]), tonumber(ARGV[6])
local out, created, samples = {}, 0, 0
for j = 0, n - 1 do
  local b = 7 + j * 4
  local gid, pid, task, blob = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local fresh = true
  if gid == '' then
    repeat
      gid = pid .. '#' .. redis.call('INCR', k('gid:seq'))
    until redis.call('EXISTS', k('g:' .. gid)) == 0 and redis.call('SISMEMBER', k('gdone'), gid) == 0
  elseif redis.call('EXISTS', k('g:' .. gid)) == 1 or redis.call('SISMEMBER', k('gdone'), gid) == 1 then
    fresh = false
  end
  if fresh then
    local sc = int(-prio * 1e9 + redis.call('INCR', k('gseq')))
    local gk = k('g:' .. gid)
    redis.call('HSET', gk, 'st', 'O', 'pid', pid, 'task', task, 'G', G, 'R', R, 'n', G + R, 'pr', prio,
      'sc', sc, 'step', step, 'created', int(NOW), 'started', 0, 'adm', 0, 'scd', 0, 'prompt', blob)
    local g = {sc = sc, task = task}
    for i = 0, G + R - 1 do
      redis.call('HSET', gk, 'a' .. i, 0)
      pool_add(gid, g, i)
    end
    redis.call('SADD', k('gopen'), gid)
    created = created + 1
    samples = samples + G + R
  end
  out[#out + 1] = gid
end
out[#out + 1] = created
out[#out + 1] = samples
return out
"""

# ARGV: now, holder, max, region, group filter, ntasks, tasks...
# Returns {status, lease rows...}; status 'ok', 'noversion' or 'empty'.
SCRIPTS["acquire"] = r"""
local holder, max, region, gfilter = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
if gfilter ~= '' and redis.call('EXISTS', k('g:' .. gfilter)) == 0 then
  return redis.error_reply('NOT_FOUND no group ' .. gfilter)
end
expire_due(64)
local ntasks = tonumber(ARGV[6])
local tasks = {}
for i = 1, ntasks do tasks[ARGV[6 + i]] = true end
redis.call('ZADD', k('holders'), NOW, holder)
local cur = redis.call('HMGET', k('cur'), 'v', 'step', 'B')
local ver = cur[1]
if ver == false then ver = redis.call('GET', k('latest')) end
if ver == false then return finish({'noversion'}) end
local step, B = tn(cur[2], 0), tn(cur[3], 0)
-- E, the concurrent environments: distinct recent holders, or the leases at work plus this request
local E = math.max(redis.call('ZCOUNT', k('holders'), NOW - 60000, '+inf'),
  redis.call('ZCARD', k('active')) + max)
local inflight = tn(redis.call('GET', k('inflight')), 0)
local ttl = ttl_now()

-- candidate slots in pool order (priority, then FIFO); a bounded scan
local cands = {}
if gfilter ~= '' then
  local G = gload(gfilter)
  if G ~= nil and G.st == 'O' and (ntasks == 0 or tasks[G.task]) then
    for i = 0, G.n - 1 do
      if G['s' .. i] == 'P' then cands[#cands + 1] = {gfilter, tostring(i)} end
    end
  end
else
  local chunk = math.min(1024, math.max(16, max * 4))
  local raw = {}
  if ntasks == 0 then
    raw = redis.call('ZRANGE', k('pool'), 0, chunk - 1)
  else
    local scored = {}
    for t, _ in pairs(tasks) do
      local r = redis.call('ZRANGE', k('pool:t:' .. t), 0, chunk - 1, 'WITHSCORES')
      for i = 1, #r, 2 do scored[#scored + 1] = {tonumber(r[i + 1]), r[i]} end
    end
    table.sort(scored, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
    for i = 1, math.min(#scored, chunk) do raw[i] = scored[i][2] end
  end
  cands = raw
end

-- assignment to the step plan's actors: largest remaining quota, same region first
local quota, regions = nil, {}
local function pick_actor()
  if quota == nil then
    quota = {}
    local r = redis.call('HGETALL', k('quota'))
    for i = 1, #r, 2 do quota[#quota + 1] = {r[i], tonumber(r[i + 1])} end
  end
  local best, bestloc = nil, false
  for _, e in ipairs(quota) do
    if e[2] > 0 then
      if regions[e[1]] == nil then regions[e[1]] = redis.call('HGET', k('a:' .. e[1]), 'region') or '' end
      local loc = region ~= '' and regions[e[1]] == region
      if best == nil or (loc and not bestloc) or (loc == bestloc and (e[2] > best[2] or
          (e[2] == best[2] and e[1] < best[1]))) then
        best, bestloc = e, loc
      end
    end
  end
  if best == nil then return '' end
  best[2] = best[2] - 1
  redis.call('HINCRBY', k('quota'), best[1], -1)
  return best[1]
end

local out = {'ok'}
local groups = {}
for _, c in ipairs(cands) do
  if #out > max then break end
  local gid, idx
  if type(c) == 'table' then gid, idx = c[1], c[2] else gid, idx = string.match(c, '^(.*)|(%d+)$') end
  local G = groups[gid]
  if G == nil then G = gload(gid); groups[gid] = G end
  if G == nil or G.st ~= 'O' or G['s' .. idx] ~= 'P' then
    redis.call('ZREM', k('pool'), member(gid, idx))
    if G ~= nil then redis.call('ZREM', k('pool:t:' .. G.task), member(gid, idx)) end
  else
    local ok = true
    if G.started ~= '1' then
      -- Back-pressure: a new group starts only while the groups in flight fit the buffer's capacity.
      local cap = pol('cap')
      if cap <= 0 then cap = (pol('alpha') + 1) * math.max(E, B, G.G) end
      if inflight > 0 and inflight + G.G > cap then
        ok = false
      else
        inflight = inflight + G.G
        redis.call('INCRBY', k('inflight'), G.G)
        redis.call('HSET', k('g:' .. gid), 'started', 1)
        G.started = '1'
      end
    end
    if ok then
      local lseq = redis.call('INCR', k('lease:seq'))
      local lid = 'L' .. lseq
      local att = redis.call('HINCRBY', k('g:' .. gid), 'a' .. idx, 1)
      local as = pick_actor()
      local exp = NOW + ttl
      redis.call('HSET', k('l:' .. lid), 'id', lid, 'gid', gid, 'idx', idx, 'ver', ver, 'holder', holder,
        'iss', int(NOW), 'exp', int(exp), 'st', ACTIVE, 'att', att, 'as', as, 'step', step, 'seq', lseq)
      redis.call('ZADD', k('active'), exp, lid)
      redis.call('SADD', k('h:' .. holder), lid)
      if as ~= '' then redis.call('SADD', k('as:' .. as), lid) end
      redis.call('ZADD', k('leases'), lseq, lid)
      redis.call('HINCRBY', k('cnt'), tostring(ACTIVE), 1)
      pool_rem(gid, G, idx)
      slot_set(gid, G, idx, 'L:' .. lid)
      out[#out + 1] = lease_row(lid)
    end
  end
end
if #out == 1 then out[1] = 'empty' end
return finish(out)
"""

# ARGV: now, lease id, holder.
SCRIPTS["renew"] = r"""
local lid = ARGV[2]
local L = hmap(k('l:' .. lid))
if L.gid == nil then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
if L.holder ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION lease ' .. lid .. ' is held by ' .. L.holder)
end
if L.st == tostring(ACTIVE) then
  if NOW > tonumber(L.exp) then
    expire_lease(lid, L)
  else
    local exp = NOW + ttl_now()
    redis.call('HSET', k('l:' .. lid), 'exp', int(exp))
    redis.call('ZADD', k('active'), exp, lid)
  end
end
return finish(lease_row(lid))
"""

# ARGV: now, lease id, holder, reason.
SCRIPTS["release"] = r"""
local lid = ARGV[2]
local L = hmap(k('l:' .. lid))
if L.gid == nil then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
if L.holder ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION lease ' .. lid .. ' is held by ' .. L.holder)
end
local changed = 0
if L.st == tostring(ACTIVE) then
  if NOW > tonumber(L.exp) then
    expire_lease(lid, L)
  else
    lease_close(lid, L, RELEASED)
    redis.call('HSET', k('l:' .. lid), 'rel', ARGV[4])
    slot_return(L.gid, L.idx)
  end
  changed = 1
end
return finish({changed, lease_row(lid)})
"""

# ARGV: now, reason, nids, ids..., ngroups, groups... Returns the leases moved to CANCELLED.
SCRIPTS["cancel"] = r"""
local reason = tonumber(ARGV[2])
local nids = tonumber(ARGV[3])
local ids, gids = {}, {}
for i = 1, nids do ids[i] = ARGV[3 + i] end
local ng = tonumber(ARGV[4 + nids])
for i = 1, ng do gids[i] = ARGV[4 + nids + i] end
for _, lid in ipairs(ids) do
  if redis.call('EXISTS', k('l:' .. lid)) == 0 then return redis.error_reply('NOT_FOUND no lease ' .. lid) end
end
for _, gid in ipairs(gids) do
  if redis.call('EXISTS', k('g:' .. gid)) == 0 then return redis.error_reply('NOT_FOUND no group ' .. gid) end
end
local function cancel_one(lid)
  local L = hmap(k('l:' .. lid))
  if L.st ~= tostring(ACTIVE) then return end
  cancel_lease(lid, L, reason)
  if reason == C_STALE then slot_return(L.gid, L.idx) else slot_close(L.gid, L.idx) end
end
for _, lid in ipairs(ids) do cancel_one(lid) end
for _, gid in ipairs(gids) do
  local G = gload(gid)
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'L' then cancel_one(string.sub(s, 3)) end
  end
end
local out = {}
for i, lid in ipairs(CANCELLED_IDS) do out[i] = lid end
return finish(out)
"""

# ------------------------------------------------------------------------------------------------ settlement
# ARGV: 1 now, 2 lease, 3 trajectory, 4 holder, 5 claimed lease version, 6 status ok, 7 has tokens, 8 min
# version, 9 max version, 10 scored, 11 reward, 12 trajectory blob, 13 tau window ms, 14 nh, (v, hash)*,
# nw, (actor, tokens, generation ms)*.
# Returns {admitted, reason, detail, duplicate, group complete, group admitted, awaiting reward, lease row}.
SCRIPTS["submit"] = r"""
local lid, tid, holder = ARGV[2], ARGV[3], ARGV[4]
local L = hmap(k('l:' .. lid))
if L.gid == nil then
  redis.call('HINCRBY', k('stats'), 'rej:5', 1)
  return {0, 5, 'no lease ' .. lid, 0, 0, 0, 0, false}
end
local vk = k('vd:' .. lid)
local prev = redis.call('HGET', vk, tid)
if prev then
  redis.call('HINCRBY', k('stats'), 'dup', 1)
  local a, r, gc, ga, aw, detail = string.match(prev, '^(%d+)|(%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
  return {tonumber(a), tonumber(r), detail, 1, tonumber(gc), tonumber(ga), tonumber(aw), lease_row(lid)}
end
if L.holder ~= holder then
  redis.call('HINCRBY', k('stats'), 'rej:6', 1)
  return {0, 6, 'lease ' .. lid .. ' is held by ' .. L.holder, 0, 0, 0, 0, lease_row(lid)}
end
local tprev = redis.call('HGET', k('trj'), tid)
if tprev and string.match(tprev, '^%a:(.*)$') ~= lid then
  return redis.error_reply('ALREADY_EXISTS trajectory ' .. tid .. ' was already submitted for another lease')
end

local reason, detail = 0, ''
local gc, gadm, awaiting = 0, 0, 0
local active = L.st == tostring(ACTIVE)
if not active then
  if L.st == tostring(SETTLED) or L.st == tostring(REJECTED) then
    reason, detail = 7, 'lease ' .. lid .. ' was already settled with trajectory ' .. (L.traj or '')
  elseif L.st == tostring(CANCELLED) then
    reason, detail = 4, 'lease ' .. lid .. ' was cancelled'
  elseif L.st == tostring(RELEASED) then
    reason, detail = 1, 'lease ' .. lid .. ' was released by its holder'
  else
    reason, detail = 1, 'lease ' .. lid .. ' expired at ' .. L.exp .. ' ms'
  end
elseif NOW > tonumber(L.exp) then
  expire_lease(lid, L)
  reason, detail = 1, 'received at ' .. int(NOW) .. ' ms, after the lease expired at ' .. L.exp .. ' ms'
else
  local vj = tonumber(L.ver)
  local G = gload(L.gid)
  if G == nil or G.st ~= 'O' then
    reason, detail = 4, 'group ' .. L.gid .. ' no longer takes samples'
  elseif ARGV[6] ~= '1' then
    reason, detail = 9, 'trajectory did not end normally'
  else
    local nh = tonumber(ARGV[14])
    for i = 0, nh - 1 do
      local v, h = ARGV[15 + 2 * i], ARGV[16 + 2 * i]
      local known = redis.call('HGET', k('vhash'), v)
      if known == false then
        reason, detail = 8, 'version ' .. v .. ' is not registered'
        break
      elseif known ~= h then
        reason, detail = 3, 'reported hash of version ' .. v .. ' differs from the registered h(v)'
        break
      end
    end
    if reason == 0 then
      local minv, maxv = vj, vj
      if ARGV[7] == '1' then minv, maxv = tonumber(ARGV[8]), tonumber(ARGV[9]) end
      local n = tn(redis.call('HGET', k('cur'), 'v'), nil)
      local floor = nil
      if n ~= nil then floor = n - pol('alpha') end
      if tonumber(ARGV[5]) ~= vj then
        reason, detail = 2, 'lease_version ' .. ARGV[5] .. ' is not the lease version ' .. vj
      elseif pol('adm') == 1 then
        if minv ~= vj or maxv ~= vj then
          reason = 2
          detail = 'strict: tokens on versions ' .. minv .. '..' .. maxv .. ', lease version ' .. vj
        elseif floor ~= nil and vj < floor then
          reason, detail = 2, 'strict: lease version ' .. vj .. ' is older than n - alpha = ' .. floor
        end
      elseif floor ~= nil and minv < floor then
        reason, detail = 2, 'bounded: started on version ' .. minv .. ' < n - alpha = ' .. floor
      end
      if reason == 0 then
        -- admitted: the sample enters the buffer
        local gk = k('g:' .. L.gid)
        G.adm = redis.call('HINCRBY', gk, 'adm', 1)
        slot_set(L.gid, G, L.idx, 'D:' .. tid)
        lease_close(lid, L, SETTLED)
        redis.call('HSET', k('l:' .. lid), 'traj', tid)
        local scored = ARGV[10] == '1'
        local sk = k('s:' .. tid)
        redis.call('HSET', sk, 'gid', L.gid, 'idx', L.idx, 'ver', minv, 'lv', vj, 'blob', ARGV[12],
          'rw', ARGV[11], 'scd', scored and 1 or 0, 'res', 0, 'lease', lid)
        redis.call('ZADD', k('buf:byver'), minv, tid)
        redis.call('INCR', k('buf:n'))
        if scored then
          G.scd = redis.call('HINCRBY', gk, 'scd', 1)
          redis.call('INCR', k('buf:scored'))
        else
          awaiting = 1
        end
        redis.call('HSET', k('trj'), tid, 'B:' .. lid)
        -- completion times of the last 101 admissions; their median is re-read every 8th admission once
        -- there are enough of them (sorting on every admission costs more than the ledger's other work)
        local ncts = redis.call('LPUSH', k('ct'), int(NOW - tonumber(L.iss)))
        redis.call('LTRIM', k('ct'), 0, 100)
        if ncts < 16 or redis.call('INCR', k('ct:n')) % 8 == 0 then ttl_recompute() end
        redis.call('HINCRBY', k('stats'), 'admitted', 1)
        if G.adm >= G.G then
          -- complete: redundant leases are cancelled and their holders told
          G.st = 'C'
          redis.call('HSET', gk, 'st', 'C')
          redis.call('SREM', k('gopen'), L.gid)
          for i = 0, G.n - 1 do
            local s = G['s' .. i] or 'X'
            local c = string.sub(s, 1, 1)
            if c == 'P' then
              pool_rem(L.gid, G, i)
              slot_set(L.gid, G, i, 'X')
            elseif c == 'L' then
              local olid = string.sub(s, 3)
              local OL = hmap(k('l:' .. olid))
              if OL.st == tostring(ACTIVE) then cancel_lease(olid, OL, C_COMPLETE) end
              slot_set(L.gid, G, i, 'X')
            end
          end
          gc = 1
        end
        gadm = G.adm
        ready_update(L.gid, G)
      end
    end
  end
  if reason ~= 0 then
    lease_close(lid, L, REJECTED)
    redis.call('HSET', k('l:' .. lid), 'rej', reason, 'traj', tid)
    redis.call('HSET', k('trj'), tid, 'R:' .. lid)
    slot_return(L.gid, L.idx)
  end
  -- settled work feeds tau: tokens summed over a window, then blended into the EMA
  local b = 15 + 2 * tonumber(ARGV[14])
  local nw = tonumber(ARGV[b])
  local win = tonumber(ARGV[13])
  for i = 0, nw - 1 do
    local ak = k('a:' .. ARGV[b + 1 + 3 * i])
    local tokens, gen = tonumber(ARGV[b + 2 + 3 * i]), tonumber(ARGV[b + 3 + 3 * i])
    if redis.call('EXISTS', ak) == 1 then
      redis.call('HINCRBY', ak, 'tok', tokens)
      local r = redis.call('HMGET', ak, 'wt', 'ws')
      local wt, ws = tn(r[1], 0) + tokens, tn(r[2], 0)
      if ws == 0 then ws = NOW - gen end
      local el = NOW - ws
      if el >= win then
        -- a window much longer than asked for was mostly idle: it says nothing about capacity
        if el <= 4 * win and el > 0 then tau_observe(ak, wt * 1000 / el) end
        redis.call('HSET', ak, 'wt', 0, 'ws', int(NOW))
      else
        redis.call('HSET', ak, 'wt', wt, 'ws', int(ws))
      end
    end
  end
end
if reason ~= 0 then redis.call('HINCRBY', k('stats'), 'rej:' .. reason, 1) end
redis.call('HSET', vk, tid, (reason == 0 and 1 or 0) .. '|' .. reason .. '|' .. gc .. '|' .. gadm .. '|' ..
  awaiting .. '|' .. detail)
return finish({reason == 0 and 1 or 0, reason, detail, 0, gc, gadm, awaiting, lease_row(lid)})
"""

# ARGV: now, trajectory id, failed, reward. Returns {recorded, reward, unknown, group ready}.
SCRIPTS["record_reward"] = r"""
local tid = ARGV[2]
local t = redis.call('HGET', k('trj'), tid)
if t == false or string.sub(t, 1, 1) == 'R' then return {0, '0', 1, 0} end
if string.sub(t, 1, 1) ~= 'B' then return {0, '0', 0, 0} end
local sk = k('s:' .. tid)
local S = hmap(sk)
if S.scd == '1' then return {0, S.rw, 0, 0} end
if ARGV[3] == '1' then
  unadmit(tid, 'F')
  redis.call('HINCRBY', k('stats'), 'reward_failed', 1)
  return finish({1, '0', 0, 0})
end
redis.call('HSET', sk, 'rw', ARGV[4], 'scd', 1)
redis.call('INCR', k('buf:scored'))
local G = gload(S.gid)
G.scd = redis.call('HINCRBY', k('g:' .. S.gid), 'scd', 1)
ready_update(S.gid, G)
local ready = 0
if G.st == 'C' and G.scd >= G.G then ready = 1 end
return {1, ARGV[4], 0, ready}
"""

# ARGV: now, step, B, floor ('' = no eviction), partial, evicted so far.
# Returns {formed, batch id | evicted now, samples, min v, max v, evicted, groups csv, created, partial}.
SCRIPTS["get_batch"] = r"""
local step, B = ARGV[2], tonumber(ARGV[3])
local bk = k('batch:' .. step)
local b = hmap(bk)
if b.id ~= nil then
  if b.acked == '1' then
    return redis.error_reply('FAILED_PRECONDITION the batch of step ' .. step .. ' was already acknowledged')
  end
  return {1, b.id, tonumber(b.n), tonumber(b.minv), tonumber(b.maxv), tonumber(b.ev), b.groups,
    tonumber(b.created), tonumber(b.partial)}
end
local ev = 0
if ARGV[4] ~= '' then
  local stale = redis.call('ZRANGEBYSCORE', k('buf:byver'), '-inf', '(' .. ARGV[4], 'LIMIT', 0, 10000)
  for _, tid in ipairs(stale) do
    if unadmit(tid, 'E') then ev = ev + 1 end
  end
  if ev > 0 then redis.call('HINCRBY', k('stats'), 'evicted', ev) end
end
local take, total = {}, 0
local ready = redis.call('ZRANGE', k('ready'), 0, -1)
for _, gid in ipairs(ready) do
  if total >= B then break end
  take[#take + 1] = gid
  total = total + tonumber(redis.call('HGET', k('g:' .. gid), 'G'))
end
if total < B and (ARGV[5] ~= '1' or total == 0) then return finish({0, ev, total}) end
local minv, maxv = nil, nil
for _, gid in ipairs(take) do
  local G = gload(gid)
  redis.call('ZREM', k('ready'), gid)
  redis.call('DECRBY', k('ready:n'), G.G)
  redis.call('HSET', k('g:' .. gid), 'st', 'B')
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'D' then
      local tid = string.sub(s, 3)
      redis.call('HSET', k('s:' .. tid), 'res', 1)
      redis.call('ZREM', k('buf:byver'), tid)
      redis.call('INCR', k('buf:reserved'))
      local lv = tonumber(redis.call('HGET', k('s:' .. tid), 'lv'))
      if minv == nil or lv < minv then minv = lv end
      if maxv == nil or lv > maxv then maxv = lv end
    end
  end
end
local id = 'b' .. step .. '-' .. redis.call('INCR', k('batch:seq'))
local partial = 0
if total < B then partial = 1 end
local evt = tonumber(ARGV[6]) + ev
redis.call('HSET', bk, 'id', id, 'n', total, 'minv', minv, 'maxv', maxv, 'ev', evt,
  'groups', table.concat(take, ','), 'created', int(NOW), 'acked', 0, 'partial', partial)
redis.call('ZADD', k('batches'), step, step)
return finish({1, id, total, minv, maxv, evt, table.concat(take, ','), NOW, partial})
"""

# ARGV: now, step, batch id. Returns the samples released.
SCRIPTS["ack_batch"] = r"""
local bk = k('batch:' .. ARGV[2])
local b = hmap(bk)
if b.id == nil then return redis.error_reply('NOT_FOUND no batch for step ' .. ARGV[2]) end
if b.id ~= ARGV[3] then
  return redis.error_reply('FAILED_PRECONDITION the batch of step ' .. ARGV[2] .. ' is ' .. b.id ..
    ', not ' .. ARGV[3])
end
if b.acked == '1' then return 0 end
local released = 0
for gid in string.gmatch(b.groups, '[^,]+') do
  local G = gload(gid)
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'D' then
      if sample_remove(string.sub(s, 3), 'K') then released = released + 1 end
    end
  end
  redis.call('HDEL', k('g:' .. gid), 'prompt')
  group_end(gid, 'K')
  if G.started == '1' then redis.call('DECRBY', k('inflight'), G.G) end
end
redis.call('HSET', bk, 'acked', 1)
return released
"""

# ------------------------------------------------------------------------------------------------ reaper
# ARGV: now, lease retention ms, actor retention ms. Returns {expired, presumed dead, purged}.
SCRIPTS["reap"] = r"""
local expired = expire_due(256)
local dead = 0
local tout = pol('tout')
for _, aid in ipairs(redis.call('SMEMBERS', k('actors'))) do
  local r = redis.call('HMGET', k('a:' .. aid), 'live', 'hb')
  if r[1] == '1' or r[1] == '2' then
    if tonumber(r[2]) + tout < NOW then
      actor_gone(aid, 3, 2)
      dead = dead + 1
    end
  elseif r[1] == false or tonumber(r[2]) < NOW - tonumber(ARGV[3]) then
    redis.call('DEL', k('a:' .. aid))
    redis.call('SREM', k('actors'), aid)
  end
end
redis.call('ZREMRANGEBYSCORE', k('holders'), '-inf', '(' .. int(NOW - 60000))
local purged = 0
local cutoff = '(' .. int(NOW - tonumber(ARGV[2]))
for _, lid in ipairs(redis.call('ZRANGEBYSCORE', k('ended'), '-inf', cutoff, 'LIMIT', 0, 256)) do
  local traj = redis.call('HGET', k('l:' .. lid), 'traj')
  if traj then
    local t = redis.call('HGET', k('trj'), traj)
    if t and string.sub(t, 1, 1) ~= 'B' then redis.call('HDEL', k('trj'), traj) end
  end
  redis.call('DEL', k('l:' .. lid), k('vd:' .. lid))
  redis.call('ZREM', k('leases'), lid)
  redis.call('ZREM', k('ended'), lid)
  purged = purged + 1
end
for _, gid in ipairs(redis.call('ZRANGEBYSCORE', k('gended'), '-inf', cutoff, 'LIMIT', 0, 256)) do
  redis.call('DEL', k('g:' .. gid))
  redis.call('SADD', k('gdone'), gid)
  redis.call('ZREM', k('gended'), gid)
end
return finish({expired, dead, purged})
"""


def source(name: str) -> str:
    return LIB.replace("__DEFAULTS__", _DEFAULTS_LUA) + SCRIPTS[name]
