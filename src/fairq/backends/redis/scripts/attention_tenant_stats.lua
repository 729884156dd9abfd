-- attention_tenant_stats: what attention_policy needs for TenantStats — the usage of the
-- last minute (the buckets since usage_since(now), older ones deleted) and, for the active
-- keys with visible backlog, their tenant, visible count, running slices and the
-- max_concurrency of their plan. The client sums, shares and ranks (tenant_at_cap). The
-- keys come one SSCAN chunk of A backlog per call (from `cursor`; the usage with the first
-- chunk only), so no call walks a domain of a million keys at once.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 cursor ("0": the first call), 3 chunk
-- returns {{tenant, busy, slices, messages}... per bucket (first call; else empty),
--          {tenant, visible, active, cap, key}..., next cursor ("0": done)}
--         | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local used = {}
if arg(2) == '0' then
  prune_usage(d)
  for _, b in ipairs(redis.call('ZRANGE', d.a .. 'ub', 0, -1)) do
    local flat = redis.call('HGETALL', d.a .. 'u:' .. b)
    for i = 1, #flat, 2 do
      local busy, slices, msgs = string.match(flat[i + 1], '^(%S+) (%S+) (%S+)$')
      used[#used + 1] = {flat[i], busy, tonumber(slices), tonumber(msgs)}
    end
  end
end
local keys = {}
local scan = redis.call('SSCAN', d.a .. 'backlog', arg(2), 'COUNT', narg(3))
for _, key in ipairs(scan[2]) do
  local k = load_key(d, key)
  if k and k.state == 'active' then
    local q = load_queue(k.queue)
    if q then
      local visible = redis.call('ZCARD', q.r) + tonumber(redis.call('HGET', q.n, 'blocked') or 0)
      if visible > 0 then
        keys[#keys + 1] = {k.tenant, visible, k.active, plan_of(d, k).max_concurrency, key}
      end
    end
  end
end
finish()
return {used, keys, scan[1]}
