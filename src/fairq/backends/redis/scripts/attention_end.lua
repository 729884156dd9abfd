-- attention_end: release a slice's token, count what it processed, and signal the key again
-- at the tail if it has backlog left (attention_policy.on_slice_end); the slice's real cost
-- replaces the estimate its tenant was charged (attention_policy.on_end). The slice's last
-- acks come with it (acked first, as if sent just before), and so do the messages it
-- leased but never handed to a handler (released, not counted as an attempt).
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id, 2 slice token, 3 processed, 4 retry at ("" none), 5 the
--       domain's virtual clock as the client saw it ("" none), 6 charges made in the
--       domain's other shards ("tenant delta ..."), 7 the slice's work queue ("" when 8 and
--       10 are 0), 8 k, 9 the k receipts to ack in one string, 10 m, 11 the m receipts to
--       release in one string
-- returns {dues, view, tenant, delta, positions (1-based) of the receipts to ack that were
--         not current leases...}; dues: the due times of the delayed signals written; view:
--         shard_view(); tenant and delta: the correction of its charge ("" none) | error
--         FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
apply_sync(d, arg(5), arg(6))
local lost = {}
if arg(7) ~= '' then
  local q = load_queue(arg(7))
  if q then
    local ok
    ok, lost = current(q, 8)
    ack_messages(q, ok)
    local back = current(q, 10)
    release_messages(q, back)
  else
    for i = 1, narg(8) do lost[i] = i end
  end
end
local _, tenant, delta = end_slice(d, arg(2), narg(3), tonumber(arg(4)))
finish()
return {dues(), shard_view(d), tenant or '', delta and fmt(delta) or '', unpack(lost)}
