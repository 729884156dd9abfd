-- attention.lua: attention domains. A domain's keys live in the family of its work queues
-- (the first word of its work_queue template), so a publish stores the work message and
-- the signal in one slot. A domain of several shards is several such sets of keys, one
-- per shard, each in the family of its shard's work queues, each with its own scheduler:
-- the scripts are given the shard's id ("<domain>#<shard>"; the domain's name alone for a
-- domain of one shard). A = F .. 'a:' .. id .. ':'. KEYS.md lists every key:
--   F att          hash domain -> options JSON
--   A n            counters, turn_counter, sigseq, clear_sum/clear_count, discarded:<state>,
--                  vclock (the virtual clock), estimate (what a slice here costs),
--                  signals (pending signals, ready and delayed: kept as they come and go,
--                  so a stats read is O(1) at any number of tenants)
--   A k:<key>      hash: queue tenant plan state parked pending ready active tokens tokens_at
--                  backlog_since processed
--   A keys         zset (score 0) of every key, for listing
--   A backlog      set of keys with backlog (backlog_since set): what the reconciler visits
--   A t:<tenant>   list of the tenant's ready signals (key names), FIFO
--   A T:<tenant>   hash: vt, est (its slices' cost estimate), turn, since, m (its member of
--                  A sched while it has a ready signal); A tenants: set of them
--   A sched        zset of the tenants with a ready signal: score vt, member
--                  "<turn><since><tenant>" (16 hex digits each), so the first member is
--                  the smallest (vt, turn, since): attention_policy.order, O(log n)
--   A kd:<key>     zset of the key's delayed signals ("seq" -> due); A delayed: key -> the
--                  earliest of them
--   A slices       zset token -> lease end; A sk hash token -> key; A sc hash token ->
--                  "charged taken_at tenant"
--   A u:<bucket>   hash tenant -> "busy slices messages" of slices ended in that bucket
--                  (attention_policy.usage_bucket); A ub zset of the buckets (score = bucket)
-- The decisions are attention_policy.py's (on_signal, on_slice_end, refill, next_permit,
-- and the scheduler: eligible_vt, estimate, on_take, slice_cost, on_end, next_estimate,
-- usage_bucket), ported as the functions below with the same arithmetic (Lua doubles);
-- which tenant goes next is next_tenant() alone.
local INF = math.huge

-- a number as Redis must get it: redis.call turns a Lua number into 14 digits, too few for
-- virtual times and due times (a due time read back must equal the one reported)
local function fmt(x) return string.format('%.17g', x) end

-- the scheduler's rules: attention_policy.py, the same arithmetic (tests compare them)
local ESTIMATE_WEIGHT = 0.2  -- attention_policy.ESTIMATE_WEIGHT
local USAGE_BUCKET = 5.0     -- attention_policy.USAGE_BUCKET
local USAGE_BUCKETS = 12     -- ceil(TENANT_WINDOW / USAGE_BUCKET): the last minute
local function eligible_vt(vt, clock) return math.max(vt, clock) end
local function estimate(tenant, domain)
  if tenant ~= nil then return tenant end
  if domain ~= nil then return domain end
  return 0.0
end
-- returns the tenant's new vt, the domain's new clock and what was charged
local function on_take(vt, clock, expected, weight)
  local charged = expected / weight
  return vt + charged, math.max(clock, vt), charged
end
local function slice_cost(charge, held, handled)
  if charge == 'messages' then return math.max(0, handled) end
  return math.max(0.0, held)
end
local function on_end(vt, charged, cost, weight) return vt - charged + cost / weight end
local function next_estimate(old, cost)
  if old == nil then return cost end
  return old + ESTIMATE_WEIGHT * (cost - old)
end
local function usage_bucket(now) return math.floor(now / USAGE_BUCKET) end
local function usage_since(now) return usage_bucket(now) - USAGE_BUCKETS + 1 end

local function abase(fb, id) return fb .. 'a:' .. id .. ':' end
-- the domain of a shard id ("market#3" -> "market")
local function domain_of(id) return string.match(id, '^[^#]*') end

local function load_domain(fb, id)
  local name = domain_of(id)
  local raw = redis.call('HGET', fb .. 'att', name)
  if not raw then return nil end
  local c = cjson.decode(raw)
  return {name = name, id = id, sharded = id ~= name, fb = fb, a = abase(fb, id), config = c,
    raw = raw, charge = opt(c.charge) or 'time'}
end

-- the domain's virtual clock and cost estimate, read once per script
local function sched_state(d)
  if d.vclock == nil then
    local v = redis.call('HMGET', d.a .. 'n', 'vclock', 'estimate')
    d.vclock, d.estimate = tonumber(v[1]) or 0.0, tonumber(v[2])
  end
  return d
end

-- delayed signals written by this script (their due times, as stored): the broker that
-- ran it takes them on time, the others a moment later (attention_scheduled_here)
local DUES = {}
local function dues() return table.concat(DUES, ' ') end

local function plan_of(d, k)
  local p = d.config.plans[k.plan] or d.config.plans[d.config.default_plan]
  local rate = opt(p.rate)
  local bucket = INF
  if rate then bucket = opt(p.burst) or math.max(1, rate) end
  return {max_concurrency = p.max_concurrency, max_messages = p.max_messages,
          max_time = p.max_time, rate = rate, bucket = bucket, name = k.plan,
          weight = opt(p.weight) or 1.0}
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
-- half a worthwhile slice, so a take that comes somewhat late loses no tokens to the cap
local function next_permit(tokens, plan)
  local want = math.max(1, math.min(plan.bucket, plan.max_messages))
  local permit = math.max(1, math.ceil(want / 2))
  if tokens >= permit then return NOW end
  return NOW + (permit - tokens) / plan.rate + 1e-6  -- PERMIT_MARGIN
end
local function resignal_allowed(plan, active, pending) return pending + active < plan.max_concurrency end
-- attention_policy.publish_signals: a key parked while paused waits for set_resource
local function publish_signals(k)
  return not (k.parked and (k.state == 'paused' or k.state == 'maintenance'))
end

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

-- a tenant's scheduling state (A T:<tenant>); vt nil for a tenant never seen
local function load_tenant(d, tenant)
  local v = redis.call('HMGET', d.a .. 'T:' .. tenant, 'vt', 'est', 'turn', 'since', 'm')
  return {name = tenant, vt = tonumber(v[1]), est = tonumber(v[2]),
    turn = tonumber(v[3]) or 0, since = tonumber(v[4]) or 0, m = v[5] or nil}
end

-- its member of A sched: ties of vt go by turn, then by since (fixed-width hex sorts)
local function sched_member(turn, since, tenant)
  return string.format('%016x%016x', turn, since) .. tenant
end

-- the tenant's first ready signal (its ready count went 0 -> 1): it joins A sched at
-- eligible_vt(vt, clock) (a new tenant starts at the clock)
local function tenant_ready(d, tenant, since)
  sched_state(d)
  local t = load_tenant(d, tenant)
  local tk = d.a .. 'T:' .. tenant
  if t.vt == nil then redis.call('SADD', d.a .. 'tenants', tenant) end
  if t.m then redis.call('ZREM', d.a .. 'sched', t.m) end
  local vt = eligible_vt(t.vt or d.vclock, d.vclock)
  local m = sched_member(t.turn, since, tenant)
  redis.call('ZADD', d.a .. 'sched', fmt(vt), m)
  redis.call('HSET', tk, 'vt', fmt(vt), 'turn', t.turn, 'since', since, 'm', m)
end

-- a ready signal for k at the tail of its tenant
local function push_ready(d, k, since)
  if redis.call('RPUSH', d.a .. 't:' .. k.tenant, k.key) == 1 then
    tenant_ready(d, k.tenant, since)
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
  redis.call('HINCRBY', d.a .. 'n', 'signals', 1)
  if due <= NOW then
    push_ready(d, k, seq)
  else
    local at = fmt(due)
    redis.call('ZADD', d.a .. 'kd:' .. k.key, at, tostring(seq))
    key_delayed_min(d, k.key)
    DUES[#DUES + 1] = at
  end
  wake('attention:' .. d.id)
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
    redis.call('HINCRBY', d.a .. 'n', 'signals', -1)
    signal(d, k, NOW)
  end
end

local end_slice

-- usage buckets that left the window (the last minute)
local function prune_usage(d)
  local since = usage_since(NOW)
  local old = redis.call('ZRANGEBYSCORE', d.a .. 'ub', '-inf', '(' .. since)
  for _, b in ipairs(old) do redis.call('DEL', d.a .. 'u:' .. b) end
  if #old > 0 then redis.call('ZREMRANGEBYSCORE', d.a .. 'ub', '-inf', '(' .. since) end
end

-- a slice of tenant ended: its real cost replaces the estimate charged at take, feeds the
-- tenant's and the domain's estimates, and counts in the usage history
local function charge(d, tenant, charged, held, handled, weight)
  sched_state(d)
  local cost = slice_cost(d.charge, held, handled)
  local t = load_tenant(d, tenant)
  local delta = nil
  if t.vt ~= nil then
    local vt = on_end(t.vt, charged, cost, weight)
    delta = vt - t.vt
    redis.call('HSET', d.a .. 'T:' .. tenant, 'vt', fmt(vt), 'est', fmt(next_estimate(t.est, cost)))
    if t.m then redis.call('ZADD', d.a .. 'sched', 'XX', fmt(vt), t.m) end
  end
  d.estimate = next_estimate(d.estimate, cost)
  redis.call('HSET', d.a .. 'n', 'estimate', fmt(d.estimate))
  local bucket = usage_bucket(NOW)
  local uk = d.a .. 'u:' .. bucket
  local busy, slices, msgs = 0.0, 0, 0
  local old = redis.call('HGET', uk, tenant)
  if old then
    local b, s_, m = string.match(old, '^(%S+) (%S+) (%S+)$')
    busy, slices, msgs = tonumber(b), tonumber(s_), tonumber(m)
  end
  redis.call('HSET', uk, tenant, fmt(busy + math.max(0.0, held)) .. ' ' .. (slices + 1) .. ' '
    .. (msgs + handled))
  if redis.call('ZADD', d.a .. 'ub', bucket, bucket) == 1 then prune_usage(d) end
  return delta
end

-- a domain written before the scheduler (A turns, A tturn): its tenants with a ready
-- signal join A sched at the clock, their last turns kept
local function upgrade_domain(d)
  local turns = redis.call('HGETALL', d.a .. 'tturn')
  for i = 1, #turns, 2 do
    redis.call('HSET', d.a .. 'T:' .. turns[i], 'turn', turns[i + 1])
    redis.call('SADD', d.a .. 'tenants', turns[i])
  end
  for _, tenant in ipairs(redis.call('ZRANGE', d.a .. 'turns', 0, -1)) do
    if redis.call('LLEN', d.a .. 't:' .. tenant) > 0 then
      tenant_ready(d, tenant, redis.call('HINCRBY', d.a .. 'n', 'sigseq', 1))
    end
  end
  redis.call('DEL', d.a .. 'turns', d.a .. 'tturn')
end

-- delayed signals that came due join their tenant; expired slices free their token
local function sweep_domain(d)
  if redis.call('EXISTS', d.a .. 'turns') == 1 then upgrade_domain(d) end
  local now = fmt(NOW)
  local keys = redis.call('ZRANGEBYSCORE', d.a .. 'delayed', '-inf', now, 'LIMIT', 0, 200)
  for _, key in ipairs(keys) do
    local k = load_key(d, key)
    local kd = d.a .. 'kd:' .. key
    local due = redis.call('ZRANGEBYSCORE', kd, '-inf', now)
    for _, seq in ipairs(due) do
      redis.call('ZREM', kd, seq)
      if k then push_ready(d, k, tonumber(seq))
      else redis.call('HINCRBY', d.a .. 'n', 'signals', -1) end
    end
    key_delayed_min(d, key)
    if k then save_key(d, k) end
    if #due > 0 then wake('attention:' .. d.id) end
  end
  local ended = redis.call('ZRANGEBYSCORE', d.a .. 'slices', '-inf', now, 'LIMIT', 0, 200)
  for _, token in ipairs(ended) do end_slice(d, token, 0, nil, true) end
end

end_slice = function(d, token, processed, retry_at, expired)
  local key = redis.call('HGET', d.a .. 'sk', token)
  local sc = redis.call('HGET', d.a .. 'sc', token)
  local counted = tonumber(redis.call('HGET', d.a .. 'sn', token)) or 0
  redis.call('ZREM', d.a .. 'slices', token)
  redis.call('HDEL', d.a .. 'sk', token)
  redis.call('HDEL', d.a .. 'sc', token)
  redis.call('HDEL', d.a .. 'sn', token)
  if not key then return false end  -- expired and ended by the sweep, with its count
  -- the domain counts every message once: what an expired slice counted on the way (see
  -- attention_progress.lua), else all it handled; its key has the counted ones already
  count(d, 'processed', expired and counted or processed)
  local k = load_key(d, key)
  if not k then return true end
  local tenant, delta = nil, nil
  if sc and not expired then  -- a dead worker's slice keeps its estimate: its cost is unknown
    local charged, taken_at
    charged, taken_at, tenant = string.match(sc, '^(%S+) (%S+) (.*)$')
    delta = charge(d, tenant, tonumber(charged), NOW - tonumber(taken_at), processed,
      plan_of(d, k).weight)
  end
  k.active = k.active - 1
  local v = key_view(d, k)
  local when, counter = on_slice_end(v, plan_of(d, k), retry_at)
  if when and counter then
    count(d, counter, 1)
    signal(d, k, when)
  end
  note_backlog(d, k, v.visible > 0 or v.waiting_due ~= nil)
  k.added = expired and 0 or math.max(0, processed - counted)
  save_key(d, k)
  wake('attention:' .. d.id)
  return true, tenant, delta
end

-- THE scheduling decision (attention_policy.order): the tenant with a ready signal and the
-- smallest (vt, turn, since), and its oldest ready signal (FIFO, so its keys take turns).
-- Returns tenant, its A sched member, its vt and the key, or nil. The signal stays at the
-- head of the tenant's list until served(): until then it still counts as ready, so a
-- re-signal of the tenant meanwhile is no return from idle.
local function next_tenant(d)
  for _ = 1, 64 do
    local top = redis.call('ZRANGE', d.a .. 'sched', 0, 0, 'WITHSCORES')
    local m = top[1]
    if not m then return nil end
    local tenant = string.sub(m, 33)
    local key = redis.call('LINDEX', d.a .. 't:' .. tenant, 0)
    if key then return tenant, m, tonumber(top[2]), key end
    redis.call('ZREM', d.a .. 'sched', m)  -- an empty list left behind: mend it
    redis.call('HDEL', d.a .. 'T:' .. tenant, 'm')
  end
  return nil
end

-- the signal next_tenant() gave is taken: the tenant gets its new turn and its virtual
-- time new_vt; clock: the domain's new virtual clock if the signal yielded a slice (the
-- arithmetic is on_take's), else nil
local function served(d, tenant, m, new_vt, clock)
  local list = d.a .. 't:' .. tenant
  if redis.call('LPOP', list) then redis.call('HINCRBY', d.a .. 'n', 'signals', -1) end
  local turn = redis.call('HINCRBY', d.a .. 'n', 'turn_counter', 1)
  if clock ~= nil then
    d.vclock = clock
    redis.call('HSET', d.a .. 'n', 'vclock', fmt(clock))
  end
  local tk = d.a .. 'T:' .. tenant
  redis.call('ZREM', d.a .. 'sched', m)
  if redis.call('LLEN', list) > 0 then
    local m2 = sched_member(turn, tonumber(string.sub(m, 17, 32), 16), tenant)
    redis.call('ZADD', d.a .. 'sched', fmt(new_vt), m2)
    redis.call('HSET', tk, 'vt', fmt(new_vt), 'turn', turn, 'm', m2)
  else
    redis.call('HSET', tk, 'vt', fmt(new_vt), 'turn', turn)
    redis.call('HDEL', tk, 'm')
  end
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
  if n > 0 and redis.call('LLEN', old) == 0 then
    local t = load_tenant(d, k.tenant)
    if t.m then
      redis.call('ZREM', d.a .. 'sched', t.m)
      redis.call('HDEL', d.a .. 'T:' .. k.tenant, 'm')
    end
  end
  k.ready = k.ready - n
  k.tenant = tenant
  local seq = redis.call('HINCRBY', d.a .. 'n', 'sigseq', 1)
  for _ = 1, n do push_ready(d, k, seq) end
end

-- A domain of several shards: the client passes what it learnt in the other shards — the
-- largest virtual clock it saw and the charges made there to tenants since it last came
-- here ("tenant delta ..."), which move each tenant's virtual time here by the same
-- amount, so a tenant's virtual time counts its service in every shard (a tenant with no
-- state here yet starts at the clock when it first has a ready signal)
local function apply_sync(d, clock, deltas)
  sched_state(d)
  local c = tonumber(clock)
  if c and c > d.vclock then
    d.vclock = c
    redis.call('HSET', d.a .. 'n', 'vclock', fmt(c))
  end
  for tenant, delta in string.gmatch(deltas or '', '(%S+) (%S+)') do
    local tk = d.a .. 'T:' .. tenant
    local v = redis.call('HMGET', tk, 'vt', 'm')
    if v[1] then
      local vt = tonumber(v[1]) + tonumber(delta)
      redis.call('HSET', tk, 'vt', fmt(vt))
      if v[2] then redis.call('ZADD', d.a .. 'sched', 'XX', fmt(vt), v[2]) end
    end
  end
end

-- what the client keeps of this shard, after the script: "clock due count tenant vt ...":
-- the virtual clock, the next due time ("-" none: a delayed signal or a slice's lease
-- end), how many tenants have a ready signal, and the first VIEW_HEADS of them with their
-- virtual times (a tenant charged in other shards since may no longer be the first here)
local VIEW_HEADS = 8
local function shard_view(d)
  sched_state(d)
  local due = domain_due(d)
  local out = {fmt(d.vclock), due and fmt(due) or '-', redis.call('ZCARD', d.a .. 'sched')}
  local top = redis.call('ZRANGE', d.a .. 'sched', 0, VIEW_HEADS - 1, 'WITHSCORES')
  for i = 1, #top, 2 do
    out[#out + 1] = string.sub(top[i], 33)
    out[#out + 1] = top[i + 1]
  end
  return table.concat(out, ' ')
end
