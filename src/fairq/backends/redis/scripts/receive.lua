-- receive: lease up to n visible messages in delivery order (priority, availability, id),
-- dead-lettering those past retention.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 n, 3 visibility timeout ("" the queue's), 4 lease token
-- returns {next due time or "", {id, attempt, fields}...}
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local out = lease_messages(q, narg(2), tonumber(arg(3)), arg(4))
if #out == 1 then out[1] = tostring(queue_due(q) or '') end
finish()
return out
