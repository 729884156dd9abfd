-- attention.lua: attention domains. A domain's keys live in the family of its work queues
-- (the first word of its work_queue template), so a publish stores the work message and
-- the signal in one slot. A = F .. 'a:' .. domain .. ':'.
--   F att          hash domain -> options JSON
--   A n            counters, turn_counter, sigseq, clear_sum/clear_count, discarded:<state>
--   A k:<key>      hash: queue tenant plan state parked pending ready active tokens tokens_at
--                  backlog_since processed
--   A keys         zset (score 0) of every key, for listing
--   A backlog      set of keys with backlog (backlog_since set): what the reconciler visits
--   A t:<tenant>   list of the tenant's ready signals (key names), FIFO
--   A turns        zset of tenants with a ready signal; score: the turn they were last
--                  served at, or (signal seq - 2^52) if never served: least recently first
--   A tturn        hash tenant -> last turn
--   A kd:<key>     zset of the key's delayed signals ("seq" -> due); A delayed: key -> the
--                  earliest of them
--   A slices       zset token -> lease end; A sk hash token -> key
-- The decisions are attention_policy.py's (on_signal, on_slice_end, refill, next_permit),
-- ported as the functions below; which signal goes next is next_signal() alone.
local INF = math.huge
local TWO52 = 4503599627370496

local function abase(fb, domain) return fb .. 'a:' .. domain .. ':' end

local function load_domain(fb, domain)
  local raw = redis.call('HGET', fb .. 'att', domain)
  if not raw then return nil end
  local c = cjson.decode(raw)
  return {name = domain, fb = fb, a = abase(fb, domain), config = c, raw = raw}
end

local function plan_of(d, k)
  local p = d.config.plans[k.plan] or d.config.plans[d.config.default_plan]
  local rate = opt(p.rate)
  local bucket = INF
  if rate then bucket = opt(p.burst) or math.max(1, rate) end
  return {max_concurrency = p.max_concurrency, max_messages = p.max_messages,
          max_time = p.max_time, rate = rate, bucket = bucket, name = k.plan}
end

local KEY_FIELDS = {'queue', 'tenant', 'plan', 'state', 'parked', 'pending', 'ready',
  'active', 'tokens', 'tokens_at', 'backlog_since', 'processed'}

local function load_key(d, key)
  local v = redis.call('HMGET', d.a .. 'k:' .. key, unpack(KEY_FIELDS))
  if not v[1] then return nil end
  return {key = key, queue = v[1], tenant = v[2], plan = v[3], state = v[4],
    parked = v[5] == '1', pending = tonumber(v[6] or 0), ready = tonumber(v[7] or 0),
    active = tonumber(v[8] or 0), tokens = (v[9] == nil or v[9] == '') and INF or tonumber(v[9]),
    tokens_at = tonumber(v[10] or NOW), backlog_since = tonumber(v[11]),
    processed = tonumber(v[12] or 0), added = 0}
end

local function new_key(d, key, queue)
  local k = {key = key, queue = queue, tenant = key, plan = d.config.default_plan,
    state = 'active', parked = false, pending = 0, ready = 0, active = 0, tokens = INF,
    tokens_at = NOW, backlog_since = nil, processed = 0, added = 0}
  redis.call('ZADD', d.a .. 'keys', 0, key)
  return k
end

local function save_key(d, k)
  local kk = d.a .. 'k:' .. k.key
  redis.call('HSET', kk, 'queue', k.queue, 'tenant', k.tenant, 'plan', k.plan, 'state', k.state,
    'parked', k.parked and '1' or '0', 'pending', k.pending, 'ready', k.ready,
    'active', k.active, 'tokens', k.tokens == INF and '' or string.format('%.17g', k.tokens),
    'tokens_at', string.format('%.6f', k.tokens_at), 'processed', k.processed + k.added)
  if k.backlog_since then
    redis.call('HSET', kk, 'backlog_since', string.format('%.6f', k.backlog_since))
  else
    redis.call('HDEL', kk, 'backlog_since')
  end
end

local function count(d, counter, n)
  if n ~= 0 then redis.call('HINCRBY', d.a .. 'n', counter, n) end
end

-- attention_policy.refill / next_permit / resignal_allowed
local function refill(k, plan)
  if not plan.rate then return INF end
  return math.min(plan.bucket, k.tokens + math.max(0, NOW - k.tokens_at) * plan.rate)
end
local function next_permit(tokens, plan)
  local want = math.max(1, math.min(plan.bucket, plan.max_messages))
  return NOW + math.max(0, want - tokens) / plan.rate
end
local function resignal_allowed(plan, active, pending) return pending + active < plan.max_concurrency end

local function dropping(state) return state == 'disabled' or state == 'removed' end
local function parking(state) return state == 'paused' or state == 'maintenance' end

-- the key as the rules see it: its work queue's counts and the refilled bucket
local function key_view(d, k)
  local q = load_queue(k.queue)
  local visible, due = 0, nil
  if q then
    visible = redis.call('ZCARD', q.r) + tonumber(redis.call('HGET', q.n, 'blocked') or 0)
    if visible == 0 then due = queue_due(q) end
  end
  return {state = k.state, active = k.active, pending = k.pending, visible = visible,
    waiting_due = due, tokens = refill(k, plan_of(d, k))}
end

-- attention_policy.on_signal: returns action, resignal_at, fan_out
local function on_signal(v, plan)
  if dropping(v.state) then return 'drop', nil, false end
  if parking(v.state) then return 'park', nil, false end
  if v.active >= plan.max_concurrency then
    if resignal_allowed(plan, v.active, v.pending) then return 'block', NOW, false end
    return 'block', nil, false
  end
  if v.visible == 0 then
    if v.waiting_due and v.pending == 0 and v.active == 0 then
      return 'empty', v.waiting_due, false
    end
    return 'empty', nil, false
  end
  if v.tokens < 1 then return 'rate_limited', next_permit(v.tokens, plan), false end
  local fan_out = v.visible > plan.max_messages
    and resignal_allowed(plan, v.active + 1, v.pending)
    and v.tokens >= plan.max_messages + 1
  return 'slice', nil, fan_out
end

-- attention_policy.on_slice_end: returns when, counter
local function on_slice_end(v, plan, retry_at)
  if dropping(v.state) or parking(v.state) then return nil, nil end
  if not resignal_allowed(plan, v.active, v.pending) then return nil, nil end
  if retry_at and v.visible > 0 then return retry_at, 'rate_limited' end
  if v.visible > 0 then return NOW, 'republished' end
  if v.waiting_due and v.pending == 0 and v.active == 0 then return v.waiting_due, 'republished' end
  return nil, nil
end

local function tenant_score(d, tenant, since)
  local turn = tonumber(redis.call('HGET', d.a .. 'tturn', tenant) or 0)
  if turn > 0 then return turn end
  return since - TWO52
end

-- a ready signal for k at the tail of its tenant
local function push_ready(d, k, since)
  local list = d.a .. 't:' .. k.tenant
  if redis.call('RPUSH', list, k.key) == 1 then
    redis.call('ZADD', d.a .. 'turns', tenant_score(d, k.tenant, since), k.tenant)
  end
  k.ready = k.ready + 1
end

local function key_delayed_min(d, key)
  local first = redis.call('ZRANGE', d.a .. 'kd:' .. key, 0, 0, 'WITHSCORES')
  if first[2] then redis.call('ZADD', d.a .. 'delayed', first[2], key)
  else redis.call('ZREM', d.a .. 'delayed', key) end
end

-- a signal for k now (at the tail of its tenant) or delayed until due
local function signal(d, k, due)
  local seq = redis.call('HINCRBY', d.a .. 'n', 'sigseq', 1)
  k.pending = k.pending + 1
  if due <= NOW then
    push_ready(d, k, seq)
  else
    redis.call('ZADD', d.a .. 'kd:' .. k.key, due, tostring(seq))
    key_delayed_min(d, k.key)
  end
  wake('attention:' .. d.name)
end

local function note_backlog(d, k, has)
  if has and not k.backlog_since then
    k.backlog_since = NOW
    redis.call('SADD', d.a .. 'backlog', k.key)
  elseif not has and k.backlog_since then
    redis.call('HINCRBYFLOAT', d.a .. 'n', 'clear_sum', NOW - k.backlog_since)
    redis.call('HINCRBY', d.a .. 'n', 'clear_count', 1)
    k.backlog_since = nil
    redis.call('SREM', d.a .. 'backlog', k.key)
  end
end

-- an immediate message must not wait behind the key's delayed signals only
local function pull_forward(d, k)
  if k.ready > 0 then return end
  local kd = d.a .. 'kd:' .. k.key
  local first = redis.call('ZRANGE', kd, 0, 0)
  if first[1] then
    redis.call('ZREM', kd, first[1])
    key_delayed_min(d, k.key)
    k.pending = k.pending - 1
    signal(d, k, NOW)
  end
end

local end_slice

-- delayed signals that came due join their tenant; expired slices free their token
local function sweep_domain(d)
  local keys = redis.call('ZRANGEBYSCORE', d.a .. 'delayed', '-inf', NOW, 'LIMIT', 0, 200)
  for _, key in ipairs(keys) do
    local k = load_key(d, key)
    local kd = d.a .. 'kd:' .. key
    local due = redis.call('ZRANGEBYSCORE', kd, '-inf', NOW)
    for _, seq in ipairs(due) do
      redis.call('ZREM', kd, seq)
      if k then push_ready(d, k, tonumber(seq)) end
    end
    key_delayed_min(d, key)
    if k then save_key(d, k) end
    if #due > 0 then wake('attention:' .. d.name) end
  end
  local ended = redis.call('ZRANGEBYSCORE', d.a .. 'slices', '-inf', NOW, 'LIMIT', 0, 200)
  for _, token in ipairs(ended) do end_slice(d, token, 0, nil) end
end

end_slice = function(d, token, processed, retry_at)
  local key = redis.call('HGET', d.a .. 'sk', token)
  redis.call('ZREM', d.a .. 'slices', token)
  redis.call('HDEL', d.a .. 'sk', token)
  count(d, 'processed', processed)
  if not key then return false end
  local k = load_key(d, key)
  if not k then return true end
  k.active = k.active - 1
  local v = key_view(d, k)
  local when, counter = on_slice_end(v, plan_of(d, k), retry_at)
  if when and counter then
    count(d, counter, 1)
    signal(d, k, when)
  end
  note_backlog(d, k, v.visible > 0 or v.waiting_due ~= nil)
  k.added = processed
  save_key(d, k)
  wake('attention:' .. d.name)
  return true
end

-- THE scheduling decision: which ready signal goes next (least recently served tenant
-- first, FIFO within the tenant). Returns the key and its tenant, or nil.
local function next_signal(d)
  for _ = 1, 64 do
    local top = redis.call('ZRANGE', d.a .. 'turns', 0, 0)
    local tenant = top[1]
    if not tenant then return nil end
    local list = d.a .. 't:' .. tenant
    local key = redis.call('LPOP', list)
    if key then
      local turn = redis.call('HINCRBY', d.a .. 'n', 'turn_counter', 1)
      redis.call('HSET', d.a .. 'tturn', tenant, turn)
      if redis.call('LLEN', list) > 0 then redis.call('ZADD', d.a .. 'turns', turn, tenant)
      else redis.call('ZREM', d.a .. 'turns', tenant) end
      return key, tenant
    end
    redis.call('ZREM', d.a .. 'turns', tenant)  -- an empty list left behind: mend it
  end
  return nil
end

-- the domain's next due time (a delayed signal or a slice's lease end), for waiters
local function domain_due(d)
  local due = nil
  local a = redis.call('ZRANGE', d.a .. 'delayed', 0, 0, 'WITHSCORES')
  if a[2] then due = tonumber(a[2]) end
  local b = redis.call('ZRANGE', d.a .. 'slices', 0, 0, 'WITHSCORES')
  if b[2] and (due == nil or tonumber(b[2]) < due) then due = tonumber(b[2]) end
  return due
end

local function move_tenant(d, k, tenant)
  local old = d.a .. 't:' .. k.tenant
  local n = redis.call('LREM', old, 0, k.key)
  if redis.call('LLEN', old) == 0 then redis.call('ZREM', d.a .. 'turns', k.tenant) end
  k.ready = k.ready - n
  k.tenant = tenant
  local seq = redis.call('HINCRBY', d.a .. 'n', 'sigseq', 1)
  for _ = 1, n do push_ready(d, k, seq) end
end
