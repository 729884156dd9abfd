-- queue.lua: a queue's messages and how they move (insert, lease, settle, dead-letter,
-- sweep). Every queue operation script is built on these. Layout in KEYS.md:
--   s stream of records (id order)   r ready zset (delivery order)   d delayed zset (due)
--   l leased zset (lease end)        a attempts hash                  k lease tokens hash
--   h FIFO heads hash, g:<group> blocked ids list, v blocked availability hash
--   y shared-body refs hash          n counters hash                  u/x dedup hash/expiry
local TWO32 = 4294967296
local QCACHE = {}
local TOUCHED = {}   -- queues whose delayed/leased sets changed: the family due index follows
local TOUCHED_LIST = {}

local function opt(v) if v == nil or v == NULL then return nil end return v end

local function load_queue(name)
  local q = QCACHE[name]
  if q ~= nil then return q or nil end
  local fb = fbase_of(name)
  local raw = redis.call('HGET', fb .. 'queues', name)
  if not raw then QCACHE[name] = false; return nil end
  local c = cjson.decode(raw)
  local b = fb .. 'q:' .. name .. ':'
  q = {
    name = name, fb = fb, b = b,
    vt = c.visibility_timeout, max_attempts = opt(c.max_attempts), dlq = opt(c.dead_letter),
    retention = c.retention, max_length = opt(c.max_length), overflow = c.overflow,
    fifo = c.fifo, maxp = c.max_priority, dedup_window = c.dedup_window,
    s = b .. 's', r = b .. 'r', d = b .. 'd', l = b .. 'l', a = b .. 'a', k = b .. 'k',
    h = b .. 'h', v = b .. 'v', y = b .. 'y', n = b .. 'n', u = b .. 'u', x = b .. 'x',
  }
  QCACHE[name] = q
  return q
end

local function create_queue(name, config_json)
  redis.call('HSET', fbase_of(name) .. 'queues', name, config_json)
  QCACHE[name] = nil
  return load_queue(name)
end

local function touch(q)
  if not TOUCHED[q.name] then TOUCHED[q.name] = q; TOUCHED_LIST[#TOUCHED_LIST + 1] = q end
end

-- the earliest time a delayed message or a lease of q comes due (nil: none)
local function queue_due(q)
  local due = nil
  local d = redis.call('ZRANGE', q.d, 0, 0, 'WITHSCORES')
  if d[2] then due = tonumber(d[2]) end
  local l = redis.call('ZRANGE', q.l, 0, 0, 'WITHSCORES')
  if l[2] and (due == nil or tonumber(l[2]) < due) then due = tonumber(l[2]) end
  return due
end

local function update_due()
  for _, q in ipairs(TOUCHED_LIST) do
    local due = queue_due(q)
    if due then redis.call('ZADD', q.fb .. 'due', due, q.name)
    else redis.call('ZREM', q.fb .. 'due', q.name) end
  end
  TOUCHED = {}; TOUCHED_LIST = {}
end

local function ready_score(q, prio, avail) return (q.maxp - prio) * TWO32 + avail end

-- the fields of a record as a table (field -> value)
local function record(q, id)
  local got = redis.call('XRANGE', q.s, sid(id), sid(id))
  if not got[1] then return nil end
  local f = got[1][2]
  local rec = {}
  for i = 1, #f, 2 do rec[f[i]] = f[i + 1] end
  return rec
end

local function record_body(q, rec)
  if rec.b then return rec.b end
  if rec.br then return redis.call('HGET', q.fb .. 'b', rec.br) or '' end
  return ''
end

local function unref_body(fb, ref)
  if redis.call('HINCRBY', fb .. 'bc', ref, -1) <= 0 then
    redis.call('HDEL', fb .. 'bc', ref)
    redis.call('HDEL', fb .. 'b', ref)
  end
end

local function fields_of(q, id)
  local got = redis.call('XRANGE', q.s, sid(id), sid(id))
  if not got[1] then return nil end
  local f = got[1][2]
  -- a shared body is resolved here so the client always gets 'b'
  for i = 1, #f, 2 do
    if f[i] == 'br' then
      f[#f + 1] = 'b'; f[#f + 1] = redis.call('HGET', q.fb .. 'b', f[i + 1]) or ''
      break
    end
  end
  return f
end

-- make a message visible (ready), or delayed until avail if that is in the future
local function make_available(q, id, prio, avail)
  if avail > NOW then
    redis.call('ZADD', q.d, avail, id); touch(q)
  else
    redis.call('ZADD', q.r, ready_score(q, prio, avail), id)
    wake(q.name)
  end
end

-- a message stored in an attention key's work queue past the attention API (a plain send,
-- a redrive, a move): the key goes in its domain's A recon set, which the reconciler
-- visits, so it needs no look at keys nothing was sent to. Q n's field att holds
-- "domain TAB A TAB key" (attention_publish writes it, and turns this off for its send).
local PAST_API = true
local function note_past_api(q)
  local att = redis.call('HGET', q.n, 'att')
  if not att then return end
  local domain, a, key = string.match(att, '^([^\t]*)\t([^\t]*)\t(.*)$')
  if domain and redis.call('HEXISTS', q.fb .. 'att', domain) == 1 then
    redis.call('SADD', a .. 'recon', key)
  end
end

-- store new records in q; each item: {fields = {k, v, ...}, delay, prio, group, ref}
local function insert(q, items)
  local ids = new_ids(q.fb, #items)
  local headed = {}
  local ready, delayed = {}, {}
  for i, it in ipairs(items) do
    local id = ids[i]
    local f = it.fields
    local grp = it.group
    if q.fifo and not grp then grp = 'default' end
    if grp then f[#f + 1] = 'g'; f[#f + 1] = grp end
    local prio = it.prio or 0
    if prio > 0 then f[#f + 1] = 'p'; f[#f + 1] = prio end
    redis.call('XADD', q.s, sid(id), unpack(f))
    if it.ref then redis.call('HSET', q.y, id, it.ref) end
    local avail = NOW + (it.delay or 0)
    local blocked = false
    if q.fifo then
      if headed[grp] or redis.call('HEXISTS', q.h, grp) == 1 then
        blocked = true
        redis.call('RPUSH', q.b .. 'g:' .. grp, id)
        redis.call('HSET', q.v, id, avail)
        redis.call('HINCRBY', q.n, 'blocked', 1)
      else
        redis.call('HSET', q.h, grp, id)
      end
      headed[grp] = true
    end
    if not blocked then
      if avail > NOW then
        delayed[#delayed + 1] = avail; delayed[#delayed + 1] = id
      else
        ready[#ready + 1] = ready_score(q, prio, avail); ready[#ready + 1] = id
      end
    end
  end
  if #ready > 0 then bulk('ZADD', q.r, ready, 2) end
  if #delayed > 0 then bulk('ZADD', q.d, delayed, 2); touch(q) end
  redis.call('HINCRBY', q.n, 'sent', #items)
  if PAST_API then note_past_api(q) end
  wake(q.name)
  return ids
end

-- the head of FIFO group grp is gone: the next blocked message becomes the head
local function advance_group(q, grp)
  local gk = q.b .. 'g:' .. grp
  local nxt = redis.call('LPOP', gk)
  if not nxt then redis.call('HDEL', q.h, grp); return end
  redis.call('HSET', q.h, grp, nxt)
  local avail = tonumber(redis.call('HGET', q.v, nxt)) or NOW
  redis.call('HDEL', q.v, nxt)
  redis.call('HINCRBY', q.n, 'blocked', -1)
  make_available(q, nxt, 0, avail)
end

-- delete a message in any state; where: 'r', 'd', 'l', 'b' (blocked) or nil (look)
local function remove(q, id, where, rec)
  if where == 'l' then redis.call('ZREM', q.l, id); redis.call('HDEL', q.k, id); touch(q)
  elseif where == 'd' then redis.call('ZREM', q.d, id); touch(q)
  elseif where == 'r' then redis.call('ZREM', q.r, id)
  end
  if q.fifo then
    rec = rec or record(q, id)
    local grp = rec and rec.g or 'default'
    if where == 'b' then
      redis.call('LREM', q.b .. 'g:' .. grp, 1, id)
      redis.call('HDEL', q.v, id)
      redis.call('HINCRBY', q.n, 'blocked', -1)
    elseif redis.call('HGET', q.h, grp) == id then
      advance_group(q, grp)
    end
  end
  redis.call('XDEL', q.s, sid(id))
  redis.call('HDEL', q.a, id)
  local ref = redis.call('HGET', q.y, id)
  if ref then redis.call('HDEL', q.y, id); unref_body(q.fb, ref) end
  wake(q.name)
end

-- where a message is now: 'r', 'd', 'l', 'b' or nil
local function where_is(q, id)
  if redis.call('ZSCORE', q.r, id) then return 'r' end
  if redis.call('ZSCORE', q.l, id) then return 'l' end
  if redis.call('ZSCORE', q.d, id) then return 'd' end
  if q.fifo and redis.call('HEXISTS', q.v, id) == 1 then return 'b' end
  return nil
end

local DL_FIELDS = {dr = true, ds = true, di = true, dn = true, dd = true}

-- a move into another family's queue on Cluster, first phase: kept in this family's
-- outbox as "target<TAB>token<TAB>packed", the token unique for ever (family and id)
local function outbox_push(q, target, id, fields, prio, group)
  redis.call('RPUSH', q.fb .. 'out', target .. '\t' .. fam_of(q.name) .. ':' .. id .. '\t'
    .. cmsgpack.pack({fields, prio, group or false}))
end

-- a subscription queue is gone: so is its subscription
local function drop_subscription_of(q)
  local owner = redis.call('HGET', q.fb .. 'subq', q.name)
  if not owner then return end
  redis.call('HDEL', q.fb .. 'subq', q.name)
  local topic, sub = string.match(owner, '^(.-)\t(.*)$')
  redis.call('HDEL', q.fb .. 't:' .. topic .. ':subs', sub)
  redis.call('HINCRBY', q.fb .. 'tv', topic, 1)
end

-- move message id (in place `where`) of q to its dead-letter queue, or discard it
local function dead_letter(q, id, where, reason, detail, attempt)
  local rec = record(q, id)
  if rec == nil then remove(q, id, where); return end
  attempt = attempt or tonumber(redis.call('HGET', q.a, id) or 0)
  local body = record_body(q, rec)
  remove(q, id, where, rec)
  if reason == 'expired' then redis.call('HINCRBY', q.n, 'expired', 1) end
  if not q.dlq then redis.call('HINCRBY', q.n, 'discarded', 1); return end
  redis.call('HINCRBY', q.n, 'dead_lettered', 1)
  local f = {'b', body}
  for k, v in pairs(rec) do
    if k ~= 'b' and k ~= 'br' and k ~= 'g' and k ~= 'p' and not DL_FIELDS[k] then
      f[#f + 1] = k; f[#f + 1] = v
    end
  end
  f[#f + 1] = 'dr'; f[#f + 1] = reason
  f[#f + 1] = 'ds'; f[#f + 1] = q.name
  f[#f + 1] = 'di'; f[#f + 1] = rec.di or id   -- the first id it ever had
  f[#f + 1] = 'dn'; f[#f + 1] = attempt
  if detail and detail ~= '' and detail ~= reason then
    f[#f + 1] = 'dd'; f[#f + 1] = detail  -- at most 1000 characters (Python cuts it)
  end
  local prio = tonumber(rec.p or 0)
  if not same_slot(q.name, q.dlq) then
    outbox_push(q, q.dlq, id, f, prio, rec.g)
    return
  end
  local dlq = load_queue(q.dlq) or create_queue(q.dlq, DLQ_CONFIG)
  insert(dlq, {{fields = f, prio = math.min(prio, dlq.maxp), group = rec.g}})
end

local function expired(q, id) return id < id_at(NOW - q.retention) end

-- bring q's due delays and ended leases to their next state
local function sweep_queue(q)
  local due = redis.call('ZRANGEBYSCORE', q.d, '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, 1000)
  for i = 1, #due, 2 do
    local id, at = due[i], tonumber(due[i + 1])
    if expired(q, id) then
      dead_letter(q, id, 'd', 'expired')
    else
      redis.call('ZREM', q.d, id)
      local prio = 0
      if q.maxp > 0 then local rec = record(q, id); prio = tonumber(rec and rec.p or 0) end
      redis.call('ZADD', q.r, ready_score(q, prio, at), id)
      wake(q.name)
    end
  end
  if #due > 0 then touch(q) end
  local ended = redis.call('ZRANGEBYSCORE', q.l, '-inf', NOW, 'WITHSCORES', 'LIMIT', 0, 1000)
  for i = 1, #ended, 2 do
    local id, at = ended[i], tonumber(ended[i + 1])
    local attempt = tonumber(redis.call('HGET', q.a, id) or 0)
    if q.max_attempts and attempt >= q.max_attempts then
      dead_letter(q, id, 'l', 'max_attempts', nil, attempt)
    elseif expired(q, id) then
      dead_letter(q, id, 'l', 'expired', nil, attempt)
    else
      redis.call('ZREM', q.l, id); redis.call('HDEL', q.k, id)
      local prio = 0
      if q.maxp > 0 then local rec = record(q, id); prio = tonumber(rec and rec.p or 0) end
      redis.call('ZADD', q.r, ready_score(q, prio, at), id)
      wake(q.name)
    end
  end
  if #ended > 0 then touch(q) end
end

-- sweep every queue of family fb with something due now
local function sweep_family(fb)
  local names = redis.call('ZRANGEBYSCORE', fb .. 'due', '-inf', NOW, 'LIMIT', 0, 50)
  for _, name in ipairs(names) do
    local q = load_queue(name)
    if q then sweep_queue(q); touch(q) else redis.call('ZREM', fb .. 'due', name) end
  end
end

-- receipts from arg(first): k, then one string of k "id.lease" separated by spaces;
-- returns the ids of current leases and the (1-based) positions of those not current
local function current(q, first)
  local k = narg(first)
  local ok, lost, seen = {}, {}, {}
  local ids, leases = {}, {}
  for id, lease in string.gmatch(arg(first + 1), '(%x+)%.(%x+)') do
    ids[#ids + 1] = id; leases[#leases + 1] = lease
  end
  local held_all = bulk_get('HMGET', q.k, ids)
  local till_all = bulk_get('ZMSCORE', q.l, ids)
  for i = 1, k do
    local id, lease = ids[i], leases[i]
    local held, till = held_all[i], till_all[i]
    if held == lease and till and tonumber(till) > NOW then
      if not seen[id] then seen[id] = true; ok[#ok + 1] = id end
    else
      lost[#lost + 1] = i
    end
  end
  return ok, lost
end

local function hex_of_sid(s)
  local ms, c = string.match(s, '^(%d+)-(%d+)$')
  return string.format('%012x%04x', tonumber(ms), tonumber(c))
end

local function depth(q)
  return redis.call('ZCARD', q.r) + redis.call('ZCARD', q.d) + redis.call('ZCARD', q.l)
    + tonumber(redis.call('HGET', q.n, 'blocked') or 0)
end

-- can n new messages fit in bounded q? nil and the victims to drop (drop_oldest), or an
-- error reply; nothing is changed, so a publish can check every queue before it writes
local function plan_room(q, n)
  if n == 0 or not q.max_length then return nil, {} end
  if n > q.max_length then
    return fail('FULL', q.name, q.max_length, 'reject', 'the batch is larger than max_length')
  end
  local need = depth(q) + n - q.max_length
  if need <= 0 then return nil, {} end
  if q.overflow ~= 'drop_oldest' then return fail('FULL', q.name, q.max_length, q.overflow, '') end
  local victims = {}
  local cursor = '-'
  while #victims < need do
    local got = redis.call('XRANGE', q.s, cursor, '+', 'COUNT', 200)
    if #got == 0 then break end
    for _, e in ipairs(got) do
      local hex = hex_of_sid(e[1])
      local w = where_is(q, hex)
      if w == 'r' or w == 'b' then victims[#victims + 1] = {hex, w} end
      if #victims >= need then break end
    end
    cursor = '(' .. got[#got][1]
  end
  if #victims < need then
    return fail('FULL', q.name, q.max_length, 'drop_oldest', 'no visible message can be dropped')
  end
  return nil, victims
end

local function apply_room(q, victims)
  for _, v in ipairs(victims) do dead_letter(q, v[1], v[2], 'overflow') end
end

-- delete queue q with its messages, dedup entries and the subscription it serves
local function drop_queue(q)
  for _, ref in ipairs(redis.call('HVALS', q.y)) do unref_body(q.fb, ref) end
  for _, grp in ipairs(redis.call('HKEYS', q.h)) do redis.call('DEL', q.b .. 'g:' .. grp) end
  redis.call('DEL', q.s, q.r, q.d, q.l, q.a, q.k, q.h, q.v, q.y, q.n, q.u, q.x)
  redis.call('HDEL', q.fb .. 'queues', q.name)
  redis.call('ZREM', q.fb .. 'due', q.name)
  drop_subscription_of(q)
  QCACHE[q.name] = false
  wake(q.name)
end

-- the records of ids (hex), as field lists by id: one XRANGE over their span when they are
-- close together in the stream (the common case: popped in send order), else one each
local function records_of(q, ids)
  local out = {}
  if #ids == 0 then return out end
  local sorted = {}
  for i, id in ipairs(ids) do sorted[i] = id end
  table.sort(sorted)
  local got = redis.call('XRANGE', q.s, sid(sorted[1]), sid(sorted[#sorted]),
    'COUNT', 4 * #ids + 16)
  if #got == #sorted and hex_of_sid(got[1][1]) == sorted[1]
      and hex_of_sid(got[#got][1]) == sorted[#sorted] then
    -- every ready id is in the stream (an invariant) and the span holds nothing else:
    -- the entries are the ids, in order
    for i, e in ipairs(got) do out[sorted[i]] = e[2] end
  else
    local wanted = {}
    for _, id in ipairs(ids) do wanted[id] = true end
    for _, e in ipairs(got) do
      local id = hex_of_sid(e[1])
      if wanted[id] then out[id] = e[2] end
    end
    for _, id in ipairs(ids) do
      if not out[id] then
        local one = redis.call('XRANGE', q.s, sid(id), sid(id))
        if one[1] then out[id] = one[1][2] end
      end
    end
  end
  -- a shared body is resolved here so the client always gets 'b'
  if redis.call('EXISTS', q.y) == 1 then
    for _, f in pairs(out) do
      for i = 1, #f, 2 do
        if f[i] == 'br' then
          f[#f + 1] = 'b'; f[#f + 1] = redis.call('HGET', q.fb .. 'b', f[i + 1]) or ''
          break
        end
      end
    end
  end
  return out
end

-- lease up to n visible messages of q in delivery order (priority, availability, id),
-- dead-lettering those past retention; returns {"", {id, attempt, fields}...}. The leased
-- ones are written with one command per structure, not one per message.
local function lease_messages(q, n, vt, lease)
  local until_ = NOW + (vt or q.vt)
  local out = {''}
  local cutoff = id_at(NOW - q.retention)
  while #out - 1 < n do
    local got = redis.call('ZPOPMIN', q.r, n - (#out - 1))
    if #got == 0 then break end
    local ids = {}
    for i = 1, #got, 2 do
      local id = got[i]
      if id < cutoff then dead_letter(q, id, nil, 'expired') else ids[#ids + 1] = id end
    end
    if #ids > 0 then
      local wa, wl, wk = widen('h', q.a, #ids), widen('z', q.l, #ids), widen('h', q.k, #ids)
      local before = bulk_get('HMGET', q.a, ids)
      local attempts, leased, tokens = {}, {}, {}
      local redelivered = 0
      for i, id in ipairs(ids) do
        local attempt = tonumber(before[i] or 0) + 1
        if attempt > 1 then redelivered = redelivered + 1 end
        attempts[#attempts + 1] = id; attempts[#attempts + 1] = attempt
        leased[#leased + 1] = until_; leased[#leased + 1] = id
        tokens[#tokens + 1] = id; tokens[#tokens + 1] = lease
        before[i] = attempt
      end
      bulk('HSET', q.a, attempts, 2)
      bulk('ZADD', q.l, leased, 2)
      bulk('HSET', q.k, tokens, 2)
      narrow('h', q.a, wa); narrow('z', q.l, wl); narrow('h', q.k, wk)
      if redelivered > 0 then redis.call('HINCRBY', q.n, 'redelivered', redelivered) end
      local recs = records_of(q, ids)
      for i, id in ipairs(ids) do out[#out + 1] = {id, before[i], recs[id] or {}} end
    end
    touch(q)
  end
  return out
end

-- end the current leases of ids (from current()) at once, the delivery not counted as an
-- attempt
local function release_messages(q, ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', q.l, id); redis.call('HDEL', q.k, id)
    if redis.call('HINCRBY', q.a, id, -1) <= 0 then redis.call('HDEL', q.a, id) end
    local prio = 0
    if q.maxp > 0 then local rec = record(q, id); prio = tonumber(rec and rec.p or 0) end
    redis.call('ZADD', q.r, ready_score(q, prio, NOW), id)
    wake(q.name)
  end
  if #ids > 0 then touch(q) end
end

-- ack the current leases of ids (from current()): one command per structure when nothing
-- per message is needed (no FIFO group to advance, no shared body to release)
local function ack_messages(q, ids)
  if #ids == 0 then return end
  if q.fifo or redis.call('EXISTS', q.y) == 1 then
    for _, id in ipairs(ids) do remove(q, id, 'l') end
  else
    local sids = {}
    for i, id in ipairs(ids) do sids[i] = sid(id) end
    bulk('ZREM', q.l, ids)
    bulk('HDEL', q.k, ids)
    bulk('HDEL', q.a, ids)
    bulk('XDEL', q.s, sids)
    touch(q)
    wake(q.name)
  end
  redis.call('HINCRBY', q.n, 'acked', #ids)
end

-- store a send whose arguments start at arg(o): n, then per message 6 values (delay,
-- priority, group, attributes JSON, body, dedup id), then m (dedup id, id) pairs of
-- duplicates the client planned; returns the new ids, or nil and an error reply
local function send_messages(q, o)
  local n = narg(o)
  local items, dedups = {}, {}
  local width = 6
  if n < 0 then  -- -n: n plain bodies (no options, attributes or dedup id), one value each
    n, width = -n, 1
    for i = 1, n do
      items[i] = {fields = {'b', arg(o + i)}, delay = 0, prio = 0}
      dedups[i] = ''
    end
  end
  for i = 0, (width == 6 and n or 0) - 1 do
    local b = o + 1 + i * 6
    local prio = tonumber(arg(b + 1))
    if prio > q.maxp then return nil, fail('PRIO', q.maxp) end
    local f = {}
    local attrs = arg(b + 3)
    if attrs ~= '' then f[#f + 1] = 'a'; f[#f + 1] = attrs end
    f[#f + 1] = 'b'; f[#f + 1] = arg(b + 4)
    local grp = arg(b + 2)
    items[#items + 1] = {fields = f, delay = tonumber(arg(b)), prio = prio,
                         group = grp ~= '' and grp or nil}
    dedups[#dedups + 1] = arg(b + 5)
  end
  -- the plan: fresh dedup ids must be unknown (or expired), duplicates still known
  local function live(d)
    local v = redis.call('HGET', q.u, d)
    if not v then return nil end
    local id, exp = string.match(v, '^(%x+) (.+)$')
    if tonumber(exp) > NOW then return id end
    redis.call('HDEL', q.u, d); redis.call('ZREM', q.x, d)  -- so the next plan sees it gone
    return nil
  end
  for _, d in ipairs(dedups) do
    if d ~= '' and live(d) then return nil, fail('STALE') end
  end
  local e = o + 1 + n * width
  for j = 1, narg(e) do
    if live(arg(e + 2 * j - 1)) ~= arg(e + 2 * j) then return nil, fail('STALE') end
  end
  local err, victims = plan_room(q, n)
  if err then return nil, err end
  apply_room(q, victims)
  local ids = insert(q, items)
  if q.dedup_window > 0 then
    local exp = NOW + q.dedup_window
    local stale = redis.call('ZRANGEBYSCORE', q.x, '-inf', NOW, 'LIMIT', 0, 100)
    for _, d in ipairs(stale) do redis.call('HDEL', q.u, d); redis.call('ZREM', q.x, d) end
    for i, d in ipairs(dedups) do
      if d ~= '' then
        redis.call('HSET', q.u, d, ids[i] .. ' ' .. string.format('%.6f', exp))
        redis.call('ZADD', q.x, exp, d)
      end
    end
  end
  return ids, nil
end

-- the end of every script: the family due index, then the wake-ups
local function finish()
  update_due()
  publish_wakes()
end
