-- peek: up to `limit` messages in id (send) order, without leasing them.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 limit
-- returns {{id, attempt, fields}...}
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local out = {}
for _, e in ipairs(redis.call('XRANGE', q.s, '-', '+', 'COUNT', narg(2))) do
  local id = hex_of_sid(e[1])
  out[#out + 1] = {id, tonumber(redis.call('HGET', q.a, id) or 0), fields_of(q, id) or {}}
end
finish()
return out
