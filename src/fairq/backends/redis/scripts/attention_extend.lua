-- attention_extend: renew a slice's token lease.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 slice token
-- returns 1 | 0 (lost) | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
local d = load_domain(fb, arg(1))
if not d then return fail('NODOMAIN', arg(1)) end
local till = redis.call('ZSCORE', d.a .. 'slices', arg(2))
if not till or tonumber(till) <= NOW then return 0 end
redis.call('ZADD', d.a .. 'slices', 'XX', NOW + d.config.slice_lease, arg(2))
return 1
