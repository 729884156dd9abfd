-- attention_set_resource: create or change a key (plan, state, tenant); a parked key
-- that becomes active is signalled if it has backlog.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 key, 3 its work queue, 4 plan ("" keep), 5 state ("" keep),
--       6 tenant ("" keep)
-- returns the due times of the delayed signals written, space-separated | error
--         FQ:NODOMAIN, FQ:NOPLAN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local key, plan, state, tenant = arg(2), arg(4), arg(5), arg(6)
if plan ~= '' and not d.config.plans[plan] then finish(); return fail('NOPLAN', plan) end
local k = load_key(d, key)
if not k then
  k = new_key(d, key, arg(3))
  local q = load_queue(arg(3))  -- sends to it past the attention API reach the reconciler
  if q then redis.call('HSETNX', q.n, 'att', d.name .. '\t' .. d.a .. '\t' .. key) end
end
if plan ~= '' then k.plan = plan end
if tenant ~= '' and tenant ~= k.tenant then move_tenant(d, k, tenant) end
if state ~= '' then
  k.state = state
  if state == 'active' then
    k.parked = false
    local v = key_view(d, k)
    if k.pending == 0 and resignal_allowed(plan_of(d, k), k.active, 0) then
      if v.visible > 0 then signal(d, k, NOW)
      elseif v.waiting_due then signal(d, k, v.waiting_due) end
    end
  end
end
save_key(d, k)
finish()
return dues()
