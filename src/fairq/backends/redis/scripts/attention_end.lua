-- attention_end: release a slice's token, count what it processed, and signal the key
-- again at the tail if it has backlog left (attention_policy.on_slice_end); the slice's
-- real cost replaces the estimate its tenant was charged (attention_policy.on_end).
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 slice token, 3 processed, 4 retry at ("" none)
-- returns the due times of the delayed signals written, space-separated | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
end_slice(d, arg(2), narg(3), tonumber(arg(4)))
finish()
return dues()
