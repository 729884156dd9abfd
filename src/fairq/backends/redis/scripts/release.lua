-- release: end current leases at once, not counting the delivery as an attempt.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 k, then the k receipts ("id.lease") in one string
-- returns the positions of receipts that are not current leases
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok, lost = current(q, 2)
release_messages(q, ok)
finish()
return lost
