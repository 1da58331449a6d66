-- prelude.lua: the helpers every ledger script shares.
--
-- Loading (rollart_ledger/scripts.py): each script is this file followed by the script's own file, one
-- string for SCRIPT LOAD. The placeholder on the ``local DEF =`` line is replaced with a table of the
-- policy defaults of rollart_ledger/policy.py (DEFAULTS), the single source of them for Python and Lua.
--
-- In scope for every script: P (KEYS[1], the key prefix of one job), NOW (Redis's clock in ms), k(name)
-- (P .. name), hmap(key), tn(x, default), f17(x), int(x), pol(field) (the policy in force, hash P pol,
-- defaults filled), the lease-state / cancel-reason numbers of the proto enums, and the helpers on
-- commands, groups, leases, samples and actors below. docs/ledger.md describes every key.
--
-- Invariants the helpers keep (and scripts rely on):
-- * every script checks what can fail before its first write, so a rejected call (redis.error_reply
--   'CODE message', CODE a gRPC status name) changes nothing;
-- * a script that may cancel leases returns through finish(), which appends one CancelLeases command per
--   (holder, reason) in the same atomic step, so holders learn of every cancellation;
-- * counters move with the records they count: P cnt with lease states (lease_close), P buf:* and the
--   P unscored index with P s:<trajectory> (sample_remove), P ready / P ready:n with complete scored groups (ready_update),
--   P inflight (and P inflight:t:<task> per task) with started groups not yet in a batch;
-- * the generation accounting (P stats gen:<fate>:n / gen:<fate>:t) moves in the same atomic step as the
--   fate it counts: a sample leaving the buffer (sample_remove: trained, evicted, failed), a verdict
--   (submit), a release that reports its tokens (release); each lease's work is counted once (its acct).

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
local AT_START = 3  -- ADMISSION_POLICY_AT_START (AReaL): staleness bounded when a trajectory starts only
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

-- ------------------------------------------------------------------------------------------ accounting
-- What became of generated work (GenerationAccounting): one trajectory and its generated tokens per call.
local function acct_add(fate, tokens)
  redis.call('HINCRBY', k('stats'), 'gen:' .. fate .. ':n', 1)
  redis.call('HINCRBY', k('stats'), 'gen:' .. fate .. ':t', int(tokens))
end
local FATE_OF_MARK = {K = 'trained', E = 'evicted', F = 'failed'}

-- ------------------------------------------------------------------------------------------ samples
-- Removes a buffered sample (mark: K consumed, E evicted, F failed) and counts its fate (default: the
-- mark's); returns its generated tokens, or false when it was not in the buffer.
local function sample_remove(tid, mark, fate)
  local sk = k('s:' .. tid)
  local r = redis.call('HMGET', sk, 'scd', 'res', 'lease', 'tok')
  if redis.call('DEL', sk) == 0 then return false end
  redis.call('ZREM', k('buf:byver'), tid)
  redis.call('ZREM', k('unscored'), tid)
  redis.call('DECR', k('buf:n'))
  if r[1] == '1' then redis.call('DECR', k('buf:scored')) end
  if r[2] == '1' then redis.call('DECR', k('buf:reserved')) end
  redis.call('HSET', k('trj'), tid, mark .. ':' .. (r[3] or ''))
  local tok = tn(r[4], 0)
  acct_add(fate or FATE_OF_MARK[mark], tok)
  return tok
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
      sample_remove(string.sub(s, 3), 'E', 'failed')  -- its group failed: wasted, not stale
    end
    slot_set(gid, G, i, 'X')
  end
  G.st = 'D'
  ready_update(gid, G)
  redis.call('HSET', k('g:' .. gid), 'adm', 0, 'scd', 0)
  group_end(gid, 'D')
  redis.call('SREM', k('gopen'), gid)
  if G.started == '1' then
    redis.call('DECRBY', k('inflight'), G.G)
    redis.call('DECRBY', k('inflight:t:' .. G.task), G.G)  -- the task's share (multi-task)
  end
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
-- leased again, and a complete group opens again. Returns its generated tokens (false: not buffered).
local function unadmit(tid, mark)
  local S = hmap(k('s:' .. tid))
  if S.gid == nil then return false end
  local tok = sample_remove(tid, mark)
  local G = gload(S.gid)
  if G == nil then return tok end
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
  return tok
end

-- Evicts every unreserved buffered sample that started below ``floor`` (slots re-pooled, groups reopened).
-- Returns the samples and their generated tokens.
local function evict_below(floor)
  local ev, evt = 0, 0
  local stale = redis.call('ZRANGEBYSCORE', k('buf:byver'), '-inf', '(' .. int(floor), 'LIMIT', 0, 10000)
  for _, tid in ipairs(stale) do
    local tok = unadmit(tid, 'E')
    if tok then
      ev, evt = ev + 1, evt + tok
    end
  end
  if ev > 0 then redis.call('HINCRBY', k('stats'), 'evicted', ev) end
  return ev, evt
end

-- ------------------------------------------------------------------------------------------ the window
-- How far the batches run ahead of the plan: 0 while the planned step's batch is not formed (the synchronous
-- trainer plans step s + 1 after training step s), 1 once it is (the asynchronous trainer asks for step s's
-- batch before it plans step s), 2 when the one after is formed as well.
local function batches_ahead()
  local step = tn(redis.call('HGET', k('cur'), 'step'), 0)
  local last = redis.call('ZREVRANGE', k('batches'), 0, 0, 'WITHSCORES')
  local formed = -1
  if #last > 0 then formed = tonumber(last[2]) end
  return math.max(0, formed - step + 1)
end
-- The staleness floor of the next batch the trainer asks for, with n the planned version: each batch asks
-- with a current version one above the one before (rollart-trainer: step q with q - 1, plans step q on
-- q - 1), so a sample that started below it can never be trained on.
local function next_floor(n) return n - pol('alpha') + batches_ahead() end

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
