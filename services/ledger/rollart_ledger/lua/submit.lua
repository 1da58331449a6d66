-- submit.lua: Submit. Settles one result for lease j: the admission rules of docs/ledger.md, in order.
-- Runs after prelude.lua (concatenated at load time). KEYS[1]: the key prefix P. ARGV[1]: the caller's
-- clock in ms (logs only; times come from Redis's TIME).
--
-- ARGV: 1 now, 2 lease, 3 trajectory, 4 holder, 5 claimed lease version, 6 status ok, 7 has tokens, 8 min
-- version, 9 max version, 10 scored, 11 reward, 12 trajectory blob, 13 tau window ms, 14 nh, (v, hash)*,
-- nw, (actor, tokens, generation ms)*, then the trajectory's generated (action) tokens.
-- Returns {admitted, reason, detail, duplicate, group complete, group admitted, awaiting reward, lease row};
-- reason is a RejectionReason number (0 when admitted); lease row is false for an unknown lease.
-- Errors: ALREADY_EXISTS when the trajectory id was submitted for another lease (nothing changes).
-- Invariants: settlement is idempotent per (lease, trajectory): the first verdict is stored in P vd:<lease>
-- and returned again with duplicate = 1, counted once; WRONG_HOLDER changes nothing; a rejected lease
-- re-pools its slot; a group reaching G admitted samples is complete and its other leases are cancelled
-- (GROUP_COMPLETE) with their holders told in the same step; an admitted sample without its reward is
-- indexed in P unscored (by admission time) until RecordReward scores or fails it or it leaves the buffer.

local lid, tid, holder = ARGV[2], ARGV[3], ARGV[4]
local nh0 = tonumber(ARGV[14])
local GEN = tn(ARGV[16 + 2 * nh0 + 3 * tonumber(ARGV[15 + 2 * nh0])], 0)  -- generated tokens (accounting)
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
      if n ~= nil and pol('adm') ~= AT_START then floor = n - pol('alpha') end  -- AReaL: no bound at settlement
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
        redis.call('HSET', k('l:' .. lid), 'acct', 1)  -- counted when the sample leaves the buffer
        redis.call('HSET', sk, 'tok', int(GEN))
        redis.call('HSET', sk, 'gid', L.gid, 'idx', L.idx, 'ver', minv, 'lv', vj, 'blob', ARGV[12],
          'rw', ARGV[11], 'scd', scored and 1 or 0, 'res', 0, 'lease', lid)
        redis.call('ZADD', k('buf:byver'), minv, tid)
        redis.call('INCR', k('buf:n'))
        if scored then
          G.scd = redis.call('HINCRBY', gk, 'scd', 1)
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
