-- attention_receive: lease up to n messages of a slice's queue, as many as the key's
-- rate allows; with none allowed, the time the rate allows more.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 slice token, 3 n, 4 visibility timeout ("" the queue's),
--       5 lease token
-- returns {retry at or "", work queue, {id, attempt, fields}...} | error FQ:NODOMAIN, FQ:LOST
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
local token = arg(2)
local till = redis.call('ZSCORE', d.a .. 'slices', token)
local key = redis.call('HGET', d.a .. 'sk', token)
if not till or tonumber(till) <= NOW or not key then finish(); return fail('LOST', token) end
local k = load_key(d, key)
local plan = plan_of(d, k)
local tokens = refill(k, plan)
local n = narg(3)
local allowed = n
if tokens ~= INF then allowed = math.min(n, math.floor(tokens)) end
if allowed < 1 then
  k.tokens, k.tokens_at = tokens, NOW
  save_key(d, k)
  finish()
  return {tostring(next_permit(tokens, plan)), k.queue}
end
local q = load_queue(k.queue)
if not q then finish(); return {'', k.queue} end
local out = lease_messages(q, allowed, tonumber(arg(4)), arg(5))
if tokens ~= INF then
  k.tokens, k.tokens_at = tokens - (#out - 1), NOW
  save_key(d, k)
end
finish()
table.insert(out, 2, k.queue)
return out
