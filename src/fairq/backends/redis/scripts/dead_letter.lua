-- dead_letter: move the message of a current lease to the dead-letter queue at once
-- (reason "rejected", the caller's reason kept as fairq.detail).
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 "1", 3 the receipt ("id.lease"), 4 reason
-- returns 1 | error FQ:LOST
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ok = current(q, 2)
if #ok == 0 then finish(); return fail('LOST') end
dead_letter(q, ok[1], 'l', 'rejected', arg(4))
finish()
return 1
