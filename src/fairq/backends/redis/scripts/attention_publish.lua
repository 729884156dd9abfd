-- attention_publish: store work messages in the key's queue (declared on first use) and
-- make sure a signal for the key is pending, unless its pending signals and running
-- slices already reach its max_concurrency — one step (SPEC §5 rule 1).
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 key, 3 work queue, 4 its options JSON, 5 its dead-letter
--       queue ("" none), then the send's arguments as send.lua's from its 2nd on
-- returns {the new ids..., dues} (dues: the due times of the delayed signals written,
--         space-separated) | error FQ:NODOMAIN, FQ:REMOVED, and send.lua's
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local key, qname = arg(2), arg(3)
local k = load_key(d, key)
if k and k.state == 'removed' then finish(); return fail('REMOVED', key) end
local q = load_queue(qname)
if not q then
  q = create_queue(qname, arg(4))
  redis.call('HSETNX', q.n, 'created', tostring(NOW))
  local dlq = arg(5)
  if dlq ~= '' and same_slot(qname, dlq) and not load_queue(dlq) then
    create_queue(dlq, DLQ_CONFIG)
  end
end
PAST_API = false  -- the signal is given here
local ids, err = send_messages(q, 6)
if err then finish(); return err end
k = k or new_key(d, key, qname)
redis.call('HSETNX', q.n, 'att', d.name .. '\t' .. d.a .. '\t' .. key)
local v = key_view(d, k)
note_backlog(d, k, v.visible > 0 or v.waiting_due ~= nil)
if k.pending == 0 then
  if resignal_allowed(plan_of(d, k), k.active, 0) and publish_signals(k) then
    signal(d, k, v.visible > 0 and NOW or (v.waiting_due or NOW))
  end
elseif v.visible > 0 then
  pull_forward(d, k)
end
save_key(d, k)
finish()
ids[#ids + 1] = dues()
return ids
