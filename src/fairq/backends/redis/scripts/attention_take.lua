-- attention_take: take signals in fair order (next_tenant: the smallest (vt, turn) tenant
-- with a ready signal, its oldest signal) until one yields a slice, dropping, parking,
-- blocking, rate-limiting or finding empty the others and counting each (SPEC §5 rule 3);
-- the slice holds a concurrency token of its key (a lease) and charges its tenant an
-- estimate of its cost (attention_policy.on_take), corrected when it ends. The slice's
-- first messages are leased here too (as attention_receive would, within the key's rate),
-- so the first receive of the slice needs no call of its own.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id (the domain, or "<domain>#<shard>"), 2 the new slice's token,
--       3 the domain's virtual clock as the client saw it ("" none), 4 charges made in the
--       domain's other shards ("tenant delta ..."), 5 messages to lease (0: none),
--       6 their visibility timeout ("" the queue's), 7 their lease token
-- returns {key, queue, token, plan name, plan JSON, dues, view, tenant, charged, visible
--         left, {id, attempt, fields}...} | {dues, view} when no signal yields a slice;
--         dues: the due times of the delayed signals written, space-separated; view:
--         shard_view() | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
apply_sync(d, arg(3), arg(4))
for _ = 1, 256 do
  local tenant, m, vt, key = next_tenant(d)
  if not tenant then break end
  local k = load_key(d, key)
  local new_vt, clock = vt, nil
  if k then
    k.pending = k.pending - 1
    k.ready = k.ready - 1
    local plan = plan_of(d, k)
    local v = key_view(d, k)
    local action, resignal_at, fan_out = on_signal(v, plan)
    if action == 'drop' then
      count(d, 'discarded:' .. k.state, 1)
    elseif action == 'park' then
      k.parked = true
      count(d, 'parked', 1)
    elseif action ~= 'slice' then
      count(d, action == 'block' and 'blocked' or action, 1)
      if action == 'rate_limited' then k.tokens, k.tokens_at = v.tokens, NOW end
      if action == 'empty' and not resignal_at then note_backlog(d, k, v.waiting_due ~= nil) end
    end
    if resignal_at then signal(d, k, resignal_at) end
    if action == 'slice' then
      sched_state(d)
      -- a shard's tenants start no earlier than the domain's clock: one that became ready
      -- while this shard's clock lagged the others' gets no head start
      if d.sharded then vt = eligible_vt(vt, d.vclock) end
      local t = load_tenant(d, tenant)
      local charged
      new_vt, clock, charged = on_take(vt, d.vclock, estimate(t.est, d.estimate), plan.weight)
      local token = arg(2)
      redis.call('ZADD', d.a .. 'slices', NOW + d.config.slice_lease, token)
      redis.call('HSET', d.a .. 'sk', token, key)
      redis.call('HSET', d.a .. 'sc', token, fmt(charged) .. ' ' .. fmt(NOW) .. ' ' .. tenant)
      k.active = k.active + 1
      k.tokens, k.tokens_at = v.tokens, NOW
      if fan_out then signal(d, k, NOW) end
      -- the first messages, as attention_receive leases them
      local out, left = {''}, v.visible
      local want = math.min(narg(5), plan.max_messages)
      if k.tokens ~= INF then want = math.min(want, math.floor(k.tokens)) end
      local q = want >= 1 and load_queue(k.queue) or nil
      if q then
        out = lease_messages(q, want, tonumber(arg(6)), arg(7))
        if k.tokens ~= INF then k.tokens = k.tokens - (#out - 1) end
        left = redis.call('ZCARD', q.r) + tonumber(redis.call('HGET', q.n, 'blocked') or 0)
      end
      save_key(d, k)
      served(d, tenant, m, new_vt, clock)
      finish()
      local p = d.config.plans[k.plan] and k.plan or d.config.default_plan
      out[1] = left
      return {key, k.queue, token, p, cjson.encode(d.config.plans[p]), dues(), shard_view(d),
        tenant, fmt(charged), unpack(out)}
    end
    save_key(d, k)
  end
  served(d, tenant, m, new_vt, clock)
end
finish()
return {dues(), shard_view(d)}
