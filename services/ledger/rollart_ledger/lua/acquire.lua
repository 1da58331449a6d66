-- acquire.lua: AcquireLeases. Expires due leases, then leases pending slots in pool order.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] holder, ARGV[3] max leases, ARGV[4] holder's region, ARGV[5] group filter (''), ARGV[6] ntasks,
-- ARGV[7..] tasks.
-- Returns {status, lease rows...}; status 'ok' (at least one lease), 'noversion' (no version registered
-- yet) or 'empty'. A lease row is {HGETALL of P l:<lease>, prompt blob, h(v_j)}.
-- Errors: NOT_FOUND for an unknown group filter.
-- Invariants: v_j = n (the latest version before any plan); a new group starts only while the samples of
-- started groups not yet in a batch fit the capacity (back-pressure, below), while samples of started groups
-- are leased first (the group closest to complete first) unless the window is closed; a lease is assigned
-- to the plan's actor with the most quota left, same region first.

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
local tinflight = {}  -- per task, read when first needed (multi-task back-pressure)
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

-- Started groups first, the one closest to complete (admitted + leased samples) first, then pool order: work
-- finishes the groups a batch is waiting for before it starts new ones.
local groups = {}
local order = {}
for pos, c in ipairs(cands) do
  local gid = type(c) == 'table' and c[1] or string.match(c, '^(.*)|%d+$')
  local G = groups[gid]
  if G == nil and gid ~= nil then G = gload(gid); groups[gid] = G or false end
  local started, progress = 0, 0
  if G then
    if G.started == '1' then started = 1 end
    progress = G.adm
    for i = 0, G.n - 1 do
      if string.sub(G['s' .. i] or 'X', 1, 1) == 'L' then progress = progress + 1 end
    end
  end
  order[pos] = {c, started, progress, pos}
end
table.sort(order, function(a, b)
  if a[2] ~= b[2] then return a[2] > b[2] end
  if a[3] ~= b[3] then return a[3] > b[3] end
  return a[4] < b[4]
end)
for pos, e in ipairs(order) do cands[pos] = e[1] end

-- Back-pressure with the derived capacity (policy buffer_capacity 0): in-flight work is sized to what the
-- batches within the staleness window can take. Before any plan: (alpha + 1) * max(E, B, G). Planned: the
-- batches whose floor (next_floor(n), then one more per batch) admits v_j = n, alpha + 1 - batches_ahead()
-- of them, times B; none (the window is closed: nothing is leased, not even slots of started groups) between
-- a batch and the plan of the next version, whose work no batch could take. AT_START: (alpha + 1) * B.
local window = nil
if pol('cap') <= 0 then
  local Bq = B
  if Bq <= 0 then Bq = tn(redis.call('GET', k('bsz')), 0) end
  if pol('adm') == AT_START then
    window = (pol('alpha') + 1) * math.max(Bq > 0 and Bq or E, pol('G'))
  elseif cur[1] == false then
    window = (pol('alpha') + 1) * math.max(E, Bq, pol('G'))
  else
    local batches = pol('alpha') + 1 - batches_ahead()
    if batches <= 0 then return finish({'empty'}) end
    window = batches * math.max(Bq, pol('G'))
  end
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
for _, c in ipairs(cands) do
  if #out > max then break end
  local gid, idx
  if type(c) == 'table' then gid, idx = c[1], c[2] else gid, idx = string.match(c, '^(.*)|(%d+)$') end
  local G = groups[gid]
  if G == nil then G = gload(gid); groups[gid] = G or false end
  if not G or G.st ~= 'O' or G['s' .. idx] ~= 'P' then
    redis.call('ZREM', k('pool'), member(gid, idx))
    if G then redis.call('ZREM', k('pool:t:' .. G.task), member(gid, idx)) end
  else
    local ok = true
    if G.started ~= '1' then
      -- Back-pressure: a new group starts only while the groups in flight fit the capacity (see above).
      local cap = window or pol('cap')
      local busy = inflight
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
        inflight = inflight + G.G
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
