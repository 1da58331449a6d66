-- get_batch.lua: one attempt of GetBatch (the service waits and calls again).
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV[2] step, ARGV[3] B, ARGV[4] floor = n - alpha ('' = no eviction), ARGV[5] partial '1'/'0',
-- ARGV[6] samples and ARGV[7] their generated tokens evicted by earlier attempts of this call,
-- ARGV[8] drop zero-variance groups '1'/'0', ARGV[9] the most groups drawn for the step (0: no bound).
-- Returns {1, batch id, samples, min v, max v, evicted, groups csv, created ms, partial, evicted tokens,
-- filtered groups, filtered samples, filtered tokens} when the step has a batch (formed now or before), else
-- {0, evicted now, samples ready, evicted tokens now, groups filtered now}.
-- Errors: FAILED_PRECONDITION when the step's batch was already acknowledged.
-- Invariants: unreserved samples that started below the floor are evicted (slots re-pooled) before groups
-- are taken (not under AT_START); complete, scored groups are taken oldest first until >= B samples and
-- reserved, and leave P inflight; asking again for the same step returns the same batch until ack_batch.
-- B is remembered (P bsz) for the back-pressure of acquire.
-- Dynamic sampling (ARGV[8]): a ready group whose rewards are all equal is consumed where it is drawn (group
-- state Z, samples removed with mark Z and fate filtered, in this atomic step: never trained, never leased
-- again) and the batch is filled from further ready groups. The step's filtered counts (g s t) live in
-- P bfilt:<step> across attempts (moved into the batch hash, fg fs ft, when it forms), so neither a retried
-- call nor a restarted ledger filters or bounds twice. The bound (ARGV[9]) counts groups drawn (filtered + kept): a group
-- is filtered only while the step's filtered groups, the groups kept, it and the groups the batch still needs
-- stay within it; past that, zero-variance groups are kept (zero advantage, as without dynamic sampling). So a
-- step draws at most max(bound, the batch's groups), the batch is whole, and the bound never stalls a step.
-- Multi-task (policy fields nts > 0, ts:<task>): the batch holds ceil(B / G) groups split between the tasks
-- by share (largest remainder, ties by task tag: policy.task_group_quotas), each task's oldest first; it
-- forms only when every task has its quota ready (or, partial, at the end of the wait, with what there is).

local step, B = ARGV[2], tonumber(ARGV[3])

-- Groups per task of a batch of B samples (nil: one pool). The same rule as policy.task_group_quotas.
local function task_quotas(b)
  local nts = pol('nts')
  if nts == nil or nts <= 0 then return nil end
  if POL == nil then pol('G') end
  local shares, tasks, sum = {}, {}, 0
  for f, v in pairs(POL) do
    if string.sub(f, 1, 3) == 'ts:' then
      local t = string.sub(f, 4)
      shares[t] = tonumber(v)
      tasks[#tasks + 1] = t
      sum = sum + shares[t]
    end
  end
  if #tasks == 0 or sum <= 0 then return nil end
  local groups = math.ceil(b / pol('G'))
  local out, frac, given = {}, {}, 0
  for _, t in ipairs(tasks) do
    local x = groups * shares[t] / sum
    out[t] = math.floor(x)
    frac[t] = x - out[t]
    given = given + out[t]
  end
  table.sort(tasks, function(a, c) if frac[a] ~= frac[c] then return frac[a] > frac[c] end return a < c end)
  for i = 1, groups - given do out[tasks[i]] = out[tasks[i]] + 1 end
  return out
end
local bk = k('batch:' .. step)
local b = hmap(bk)
if b.id ~= nil then
  if b.acked == '1' then
    return redis.error_reply('FAILED_PRECONDITION the batch of step ' .. step .. ' was already acknowledged')
  end
  return {1, b.id, tonumber(b.n), tonumber(b.minv), tonumber(b.maxv), tonumber(b.ev), b.groups,
    tonumber(b.created), tonumber(b.partial), tn(b.evk, 0), tn(b.fg, 0), tn(b.fs, 0), tn(b.ft, 0)}
end
redis.call('SET', k('bsz'), B)  -- the batch size the back-pressure sizes in-flight work by (acquire)
local ev, evk = 0, 0
if ARGV[4] ~= '' and pol('adm') ~= AT_START then  -- AReaL: nothing is evicted as stale
  ev, evk = evict_below(tonumber(ARGV[4]))
end
local take, total = {}, 0
local ready = redis.call('ZRANGE', k('ready'), 0, -1)
local quotas = task_quotas(B)
local drop, maxg = ARGV[8] == '1', tn(ARGV[9], 0)
local fk = k('bfilt:' .. step)
local F = hmap(fk)
local fg, fs, ft, fnow = tn(F.g, 0), tn(F.s, 0), tn(F.t, 0), 0

-- Whether the complete, scored group's rewards are all equal (one sample included): no advantage.
local function zero_variance(G)
  local first = nil
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'D' then
      local r = tonumber(redis.call('HGET', k('s:' .. string.sub(s, 3)), 'rw'))
      if first == nil then first = r elseif r ~= first then return false end
    end
  end
  return true
end
-- Consumes a zero-variance group: its samples leave the buffer as filtered, the group ends (Z).
local function filter_group(gid, G)
  redis.call('ZREM', k('ready'), gid)
  redis.call('DECRBY', k('ready:n'), G.G)
  if G.started == '1' then
    redis.call('DECRBY', k('inflight'), G.G)
    redis.call('DECRBY', k('inflight:t:' .. G.task), G.G)
  end
  for i = 0, G.n - 1 do
    local s = G['s' .. i] or 'X'
    if string.sub(s, 1, 1) == 'D' then
      local tok = sample_remove(string.sub(s, 3), 'Z')
      if tok then fs, ft = fs + 1, ft + tok end
    end
  end
  redis.call('HDEL', k('g:' .. gid), 'prompt')
  group_end(gid, 'Z')
  fg, fnow = fg + 1, fnow + 1
end
-- Draws one ready group: true when it is kept for the batch, false when filtered. ``need``: the groups the
-- batch still needs. A group is filtered only while the groups drawn, it, and those still needed fit the bound.
local function draw(gid, need)
  if drop and (maxg == 0 or fg + #take + 1 + need <= maxg) then
    local G = gload(gid)
    if zero_variance(G) then
      filter_group(gid, G)
      return false
    end
  end
  take[#take + 1] = gid
  return true
end

if quotas == nil then
  for _, gid in ipairs(ready) do
    if total >= B then break end
    if draw(gid, math.ceil((B - total) / math.max(pol('G'), 1))) then
      total = total + tonumber(redis.call('HGET', k('g:' .. gid), 'G'))
    end
  end
else
  local short = false
  for _, gid in ipairs(ready) do
    local g = redis.call('HMGET', k('g:' .. gid), 'task', 'G')
    local q = quotas[g[1]]
    if q ~= nil and q > 0 then
      local need = 0
      for _, n in pairs(quotas) do need = need + n end
      if draw(gid, need) then
        total = total + tonumber(g[2])
        quotas[g[1]] = q - 1
      end
    end
  end
  for _, q in pairs(quotas) do if q > 0 then short = true end end
  if short then total = math.min(total, B - 1) end  -- not every task has its share yet
end
if fnow > 0 then redis.call('HSET', fk, 'g', fg, 's', fs, 't', int(ft)) end
if total < B and (ARGV[5] ~= '1' or #take == 0) then return finish({0, ev, total, evk, fnow}) end
if quotas ~= nil then
  total = 0
  for _, gid in ipairs(take) do total = total + tonumber(redis.call('HGET', k('g:' .. gid), 'G')) end
end
local minv, maxv = nil, nil
for _, gid in ipairs(take) do
  local G = gload(gid)
  redis.call('ZREM', k('ready'), gid)
  redis.call('DECRBY', k('ready:n'), G.G)
  redis.call('HSET', k('g:' .. gid), 'st', 'B')
  if G.started == '1' then
    -- in a batch: no longer in flight, so the back-pressure lets the next version's groups start now
    redis.call('DECRBY', k('inflight'), G.G)
    redis.call('DECRBY', k('inflight:t:' .. G.task), G.G)
    redis.call('HSET', k('g:' .. gid), 'started', 2)
  end
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
local evkt = tn(ARGV[7], 0) + evk
redis.call('HSET', bk, 'id', id, 'n', total, 'minv', minv, 'maxv', maxv, 'ev', evt, 'evk', int(evkt),
  'groups', table.concat(take, ','), 'created', int(NOW), 'acked', 0, 'partial', partial,
  'fg', fg, 'fs', fs, 'ft', int(ft))
redis.call('DEL', fk)
redis.call('ZADD', k('batches'), step, step)
return finish({1, id, total, minv, maxv, evt, table.concat(take, ','), NOW, partial, evkt, fg, fs, ft})
