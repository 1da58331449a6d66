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
-- ``...``: more (field, value) pairs written with the state, in the same HSET.
local function lease_close(lid, L, st, ...)
  redis.call('HSET', k('l:' .. lid), 'st', st, 'end', int(NOW), ...)
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
local FATE_OF_MARK = {K = 'trained', E = 'evicted', F = 'failed', Z = 'filtered'}

-- ------------------------------------------------------------------------------------------ samples
-- Removes a buffered sample (mark: K consumed, E evicted, F failed, Z filtered) and counts its fate (default: the
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

-- PlanStep (planning.py) watches P aepoch, not every actor's hash: every change of what a plan is made of
-- (registration, liveness, draining, weights, relay) moves it; heartbeat times, in-flight counts, settled tokens
-- and tau do not (the plan scales a tau that moved, plan_commit.lua), so they never make planning retry.
local function actors_changed() redis.call('INCR', k('aepoch')) end

-- An actor that left or was presumed dead: the leases it holds go back to the pool, the leases assigned to
-- it lose the assignment, and its share of the step's quota is dropped.
local function actor_gone(aid, live, release_reason)
  local ak = k('a:' .. aid)
  redis.call('HSET', ak, 'live', live)
  actors_changed()
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

-- A group's prompt and a registered version's h(v) never change, so one script run (a batch of many leases of
-- a few groups and versions) reads each once.
local PROMPTS, VHASHES = {}, {}
local function vhash_of(v)  -- h(v), false when v is not registered
  local vh = VHASHES[v]
  if vh == nil then
    vh = redis.call('HGET', k('vhash'), v)
    VHASHES[v] = vh
  end
  return vh
end
local function group_prompt(gid)
  local prompt = PROMPTS[gid]
  if prompt == nil then
    prompt = redis.call('HGET', k('g:' .. gid), 'prompt') or ''
    PROMPTS[gid] = prompt
  end
  return prompt
end
local function lease_row(lid)
  local L = redis.call('HGETALL', k('l:' .. lid))
  local m = {}
  for i = 1, #L, 2 do m[L[i]] = L[i + 1] end
  local gid, ver = m.gid or '', m.ver or ''
  return {L, group_prompt(gid), vhash_of(ver) or ''}
end
-- The row of a lease this script has just created with the one HSET of ``fields``: those fields as Redis
-- stored them (numbers as Redis writes them, which is Lua's tostring), without reading the hash back.
local function new_lease_row(fields)
  local L = {}
  for i, x in ipairs(fields) do L[i] = type(x) == 'number' and tostring(x) or x end
  return {L, group_prompt(L[4]), vhash_of(L[8]) or ''}
end

-- ------------------------------------------------------------------------------------------ lease + settle
-- The bodies of acquire.lua and submit.lua, here so that their batch scripts (acquire_batch.lua,
-- submit_batch.lua) run exactly the same logic per item. A is laid out as that script's ARGV (A[1], the caller's
-- clock, unused); the reply is the script's, or redis.error_reply(...) (a table with ``err``) for a refusal,
-- which is checked before the item's first write. Each call ends through finish(), so the cancellations of
-- one item are told before the next item runs.

-- What AcquireLeases reads before it leases: the version n (``ver``, false when none is registered), the step
-- and B, the in-flight counts, the TTL, the plan's quotas, and the scan of the pool head with the groups of its
-- slots. acquire_batch.lua serves its requests one after the other from one view: every lease issued updates
-- the view as it updates the store (slots leased or found stale are marked gone), so each request sees what
-- a view read after the requests before it would show, without reading the pool and its groups again.
-- ``scan``: how many pool slots to read (all pending slots of the group for a group filter).
local function acquire_view(gfilter, tasks, ntasks, scan)
  local cur = redis.call('HMGET', k('cur'), 'v', 'step', 'B')
  local V = {planned = cur[1] ~= false, ver = cur[1], groups = {}, gone = {}, ngone = 0, tinflight = {}, regions = {},
    gids = {}, progress = {}}  -- gids: each scanned slot's group; progress: admitted + leased per group
  if V.ver == false then V.ver = redis.call('GET', k('latest')) end
  if V.ver == false then return V end
  V.step, V.B = tn(cur[2], 0), tn(cur[3], 0)
  V.inflight = tn(redis.call('GET', k('inflight')), 0)
  V.ttl = ttl_now()
  -- candidate slots in pool order (priority, then FIFO); a bounded scan
  local cands = {}
  if gfilter ~= '' then
    local G = gload(gfilter)
    if G ~= nil and G.st == 'O' and (ntasks == 0 or tasks[G.task]) then
      for i = 0, G.n - 1 do
        if G['s' .. i] == 'P' then cands[#cands + 1] = {gfilter, tostring(i)} end
      end
    end
  elseif ntasks == 0 then
    cands = redis.call('ZRANGE', k('pool'), 0, scan - 1)
  else
    local scored = {}
    for t, _ in pairs(tasks) do
      local r = redis.call('ZRANGE', k('pool:t:' .. t), 0, scan - 1, 'WITHSCORES')
      for i = 1, #r, 2 do scored[#scored + 1] = {tonumber(r[i + 1]), r[i]} end
    end
    table.sort(scored, function(a, b) if a[1] ~= b[1] then return a[1] < b[1] end return a[2] < b[2] end)
    for i = 1, math.min(#scored, scan) do cands[i] = scored[i][2] end
  end
  V.scan, V.full = cands, gfilter == '' and #cands >= scan  -- full: the pool may hold more
  return V
end

-- Leases up to ``max`` slots of view V to ``holder``, considering the first ``chunk`` slots of V's scan that
-- are still in the pool (what ZRANGE of the pool head would return now). Returns the reply of acquire.lua.
local function acquire_take(V, holder, max, region, chunk)
  -- E, the concurrent environments: distinct recent holders, or the leases at work plus this request
  local E = math.max(redis.call('ZCOUNT', k('holders'), NOW - 60000, '+inf'),
    redis.call('ZCARD', k('active')) + max)
  local groups = V.groups

  -- Started groups first, the one closest to complete (admitted + leased samples) first, then pool order: work
  -- finishes the groups a batch is waiting for before it starts new ones.
  -- A group's progress is counted once per view (not once per candidate slot of it, nor per request): only
  -- the leases issued from the view change it, and they add one each.
  local gids, progress_of = V.gids, V.progress
  local order = {}
  for pos, c in ipairs(V.scan) do
    if #order >= chunk then break end
    if not V.gone[pos] then
      local gid = gids[pos]
      if gid == nil then
        gid = type(c) == 'table' and c[1] or string.match(c, '^(.*)|%d+$') or false
        gids[pos] = gid
      end
      local G = false
      if gid then
        G = groups[gid]
        if G == nil then G = gload(gid); groups[gid] = G or false end
      end
      local started, progress = 0, 0
      if G then
        if G.started == '1' then started = 1 end
        progress = progress_of[gid]
        if progress == nil then
          progress = G.adm
          for i = 0, G.n - 1 do
            local s = G['s' .. i]
            if s ~= nil and string.byte(s, 1) == 76 then progress = progress + 1 end  -- 76: 'L', leased
          end
          progress_of[gid] = progress
        end
      end
      order[#order + 1] = {c, started, progress, pos}
    end
  end
  table.sort(order, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    if a[3] ~= b[3] then return a[3] > b[3] end
    return a[4] < b[4]
  end)

  -- Back-pressure with the derived capacity (policy buffer_capacity 0): in-flight work is sized to what the
  -- batches within the staleness window can take. Before any plan: (alpha + 1) * max(E, B, G). Planned: the
  -- batches whose floor (next_floor(n), then one more per batch) admits v_j = n, alpha + 1 - batches_ahead()
  -- of them, times B; none (the window is closed: nothing is leased, not even slots of started groups) between
  -- a batch and the plan of the next version, whose work no batch could take. AT_START: (alpha + 1) * B.
  local window = nil
  if pol('cap') <= 0 then
    local Bq = V.B
    if Bq <= 0 then Bq = tn(redis.call('GET', k('bsz')), 0) end
    if pol('adm') == AT_START then
      window = (pol('alpha') + 1) * math.max(Bq > 0 and Bq or E, pol('G'))
    elseif not V.planned then
      window = (pol('alpha') + 1) * math.max(E, Bq, pol('G'))
    else
      local batches = pol('alpha') + 1 - batches_ahead()
      if batches <= 0 then return finish({'empty'}) end
      window = batches * math.max(Bq, pol('G'))
    end
  end

  -- assignment to the step plan's actors: largest remaining quota, same region first
  local regions = V.regions
  local function pick_actor()
    if V.quota == nil then
      V.quota = {}
      local r = redis.call('HGETALL', k('quota'))
      for i = 1, #r, 2 do V.quota[#V.quota + 1] = {r[i], tonumber(r[i + 1])} end
    end
    local best, bestloc = nil, false
    for _, e in ipairs(V.quota) do
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
  local tinflight = V.tinflight  -- per task, read when first needed (multi-task back-pressure)
  for _, e in ipairs(order) do
    if #out > max then break end
    local c = e[1]
    local gid, idx
    if type(c) == 'table' then gid, idx = c[1], c[2] else gid, idx = string.match(c, '^(.*)|(%d+)$') end
    local G = groups[gid]
    if G == nil then G = gload(gid); groups[gid] = G or false end
    if not G or G.st ~= 'O' or G['s' .. idx] ~= 'P' then
      redis.call('ZREM', k('pool'), member(gid, idx))
      if G then redis.call('ZREM', k('pool:t:' .. G.task), member(gid, idx)) end
      V.gone[e[4]], V.ngone = true, V.ngone + 1
    else
      local ok = true
      if G.started ~= '1' then
        -- Back-pressure: a new group starts only while the groups in flight fit the capacity (see above).
        local cap = window or pol('cap')
        local busy = V.inflight
        local share = pol('ts:' .. G.task)
        if pol('nts') > 0 and share ~= nil then
          -- Multi-task: each task gets its share of the capacity (at least a group), so that a fast task's
          -- groups waiting for a batch never keep a slow task from starting the groups that batch needs.
          cap = math.max(G.G, math.floor(cap * share + 0.5))
          if tinflight[G.task] == nil then tinflight[G.task] = tn(redis.call('GET', k('inflight:t:' .. G.task)), 0) end
          busy = tinflight[G.task]
        end
        if busy > 0 and busy + G.G > cap then
          ok = false
        else
          V.inflight = V.inflight + G.G
          if tinflight[G.task] ~= nil then tinflight[G.task] = tinflight[G.task] + G.G end
          redis.call('INCRBY', k('inflight'), G.G)
          redis.call('INCRBY', k('inflight:t:' .. G.task), G.G)
          redis.call('HSET', k('g:' .. gid), 'started', 1)
          G.started = '1'
        end
      end
      if ok then
        local lseq = redis.call('INCR', k('lease:seq'))
        local lid = 'L' .. lseq
        local att = tn(G['a' .. idx], 0) + 1  -- G is this run's own read: the slot's attempts so far
        local as = pick_actor()
        local exp = NOW + V.ttl
        local fields = {'id', lid, 'gid', gid, 'idx', idx, 'ver', V.ver, 'holder', holder,
          'iss', int(NOW), 'exp', int(exp), 'st', ACTIVE, 'att', att, 'as', as, 'step', V.step, 'seq', lseq}
        redis.call('HSET', k('l:' .. lid), unpack(fields))
        redis.call('ZADD', k('active'), exp, lid)
        redis.call('SADD', k('h:' .. holder), lid)
        if as ~= '' then redis.call('SADD', k('as:' .. as), lid) end
        redis.call('ZADD', k('leases'), lseq, lid)
        redis.call('HINCRBY', k('cnt'), tostring(ACTIVE), 1)
        pool_rem(gid, G, idx)
        -- the slot's attempts and its lease in one write (slot_set's, with the attempts)
        redis.call('HSET', k('g:' .. gid), 'a' .. idx, att, 's' .. idx, 'L:' .. lid)
        G['a' .. idx], G['s' .. idx] = tostring(att), 'L:' .. lid
        progress_of[gid] = progress_of[gid] + 1
        V.gone[e[4]], V.ngone = true, V.ngone + 1
        out[#out + 1] = new_lease_row(fields)
      end
    end
  end
  if #out == 1 then out[1] = 'empty' end
  return finish(out)
end

-- How many pool slots one request for ``max`` leases looks at (acquire_view's scan, acquire_take's chunk).
local function acquire_chunk(max) return math.min(1024, math.max(16, max * 4)) end

-- AcquireLeases (acquire.lua documents A and the reply). V: the view the request before it in the same batch
-- left (nil: read one); ``scan``: the size of a view read here (acquire_chunk(max) for a lone request).
-- Returns the reply and the view the next request of the batch may use (nil when it may not).
local function acquire_one(A, V, scan)
  local holder, max, region, gfilter = A[2], tonumber(A[3]), A[4], A[5]
  if gfilter ~= '' and redis.call('EXISTS', k('g:' .. gfilter)) == 0 then
    return redis.error_reply('NOT_FOUND no group ' .. gfilter), V
  end
  local expired = expire_due(64)
  local ntasks = tonumber(A[6])
  local tasks = {}
  for i = 1, ntasks do tasks[A[6 + i]] = true end
  redis.call('ZADD', k('holders'), NOW, holder)
  -- A filtered request reads its own view; expired leases re-pooled slots the view has not seen.
  local shared = gfilter == '' and ntasks == 0
  -- ... and a view whose scan no longer holds this request's chunk of slots still pooled is read again
  if V == nil or not shared or expired > 0 or (V.full and #V.scan - V.ngone < acquire_chunk(max)) then
    V = acquire_view(gfilter, tasks, ntasks, gfilter ~= '' and 0 or (scan or acquire_chunk(max)))
  end
  if V.ver == false then return finish({'noversion'}), nil end
  local chunk = gfilter ~= '' and #V.scan or acquire_chunk(max)
  local reply = acquire_take(V, holder, max, region, chunk)
  if shared then return reply, V end
  return reply, nil
end

-- Submit (submit.lua documents A and the reply).
local function submit_one(A)
  local lid, tid, holder = A[2], A[3], A[4]
  local nh0 = tonumber(A[14])
  local GEN = tn(A[16 + 2 * nh0 + 3 * tonumber(A[15 + 2 * nh0])], 0)  -- generated tokens (accounting)
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
    elseif A[6] ~= '1' then
      reason, detail = 9, 'trajectory did not end normally'
    else
      local nh = tonumber(A[14])
      for i = 0, nh - 1 do
        local v, h = A[15 + 2 * i], A[16 + 2 * i]
        local known = vhash_of(v)
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
        if A[7] == '1' then minv, maxv = tonumber(A[8]), tonumber(A[9]) end
        local n = tn(redis.call('HGET', k('cur'), 'v'), nil)
        local floor = nil
        if n ~= nil and pol('adm') ~= AT_START then floor = n - pol('alpha') end  -- AReaL: no bound at settlement
        if tonumber(A[5]) ~= vj then
          reason, detail = 2, 'lease_version ' .. A[5] .. ' is not the lease version ' .. vj
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
          -- the group's counts and the slot in one write (G was read by this script: no one moved them since)
          local scored = A[10] == '1'
          G.adm = G.adm + 1
          G['s' .. L.idx] = 'D:' .. tid
          if scored then
            G.scd = G.scd + 1
            redis.call('HSET', gk, 'adm', G.adm, 's' .. L.idx, G['s' .. L.idx], 'scd', G.scd)
          else
            redis.call('HSET', gk, 'adm', G.adm, 's' .. L.idx, G['s' .. L.idx])
          end
          -- acct: its work is counted when the sample leaves the buffer
          lease_close(lid, L, SETTLED, 'traj', tid, 'acct', 1)
          local sk = k('s:' .. tid)
          redis.call('HSET', sk, 'tok', int(GEN), 'gid', L.gid, 'idx', L.idx, 'ver', minv, 'lv', vj, 'blob', A[12],
            'rw', A[11], 'scd', scored and 1 or 0, 'res', 0, 'lease', lid)
          redis.call('ZADD', k('buf:byver'), minv, tid)
          redis.call('INCR', k('buf:n'))
          if scored then
            redis.call('INCR', k('buf:scored'))
          else
            awaiting = 1
            -- awaited by admission time: the reaper un-admits it if no score comes before the score deadline
            redis.call('ZADD', k('unscored'), NOW, tid)
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
    local b = 15 + 2 * tonumber(A[14])
    local nw = tonumber(A[b])
    local win = tonumber(A[13])
    for i = 0, nw - 1 do
      local ak = k('a:' .. A[b + 1 + 3 * i])
      local tokens, gen = tonumber(A[b + 2 + 3 * i]), tonumber(A[b + 3 + 3 * i])
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
  if reason ~= 0 then
    redis.call('HINCRBY', k('stats'), 'rej:' .. reason, 1)
    -- the lease's work, unless its holder already reported it (a release) or another trajectory did
    if redis.call('HSETNX', k('l:' .. lid), 'acct', 1) == 1 then
      acct_add(reason == 9 and 'failed' or 'rejected', GEN)
    end
  end
  redis.call('HSET', vk, tid, (reason == 0 and 1 or 0) .. '|' .. reason .. '|' .. gc .. '|' .. gadm .. '|' ..
    awaiting .. '|' .. detail)
  return finish({reason == 0 and 1 or 0, reason, detail, 0, gc, gadm, awaiting, lease_row(lid)})
end

-- The batch scripts' loop: ARGV[2] items, each as its argument count then its arguments (one's ARGV[2..]).
-- one(A, state) returns the item's reply and the state the next item gets (acquire's view; nil: none).
-- Returns {1, reply} or {0, 'CODE message'} per item: a refused item is reported alone.
local function run_batch(one, state)
  local n, p, out = tonumber(ARGV[2]), 3, {}
  for i = 1, n do
    local c = tonumber(ARGV[p])
    local A = {ARGV[1]}
    for j = 1, c do A[j + 1] = ARGV[p + j] end
    p = p + c + 1
    local r
    r, state = one(A, state)
    if type(r) == 'table' and r.err ~= nil then out[i] = {0, r.err} else out[i] = {1, r} end
  end
  return out
end
