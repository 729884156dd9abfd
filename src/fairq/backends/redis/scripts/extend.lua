-- extend: make current leases end `seconds` from now.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 seconds, 3 k, then the k receipts ("id.lease") in one string
-- returns the positions of receipts that are not current leases
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok, lost = current(q, 3)
local until_ = NOW + narg(2)
for _, id in ipairs(ok) do redis.call('ZADD', q.l, 'XX', until_, id) end
if #ok > 0 then touch(q) end
finish()
return lost
