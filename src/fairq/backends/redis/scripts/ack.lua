-- ack: delete the messages of current leases.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 k, then k ids and k lease tokens
-- returns the positions (1-based) of receipts that are not current leases
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok, lost = current(q, 2)
for _, id in ipairs(ok) do remove(q, id, 'l') end
if #ok > 0 then redis.call('HINCRBY', q.n, 'acked', #ok) end
finish()
return lost
