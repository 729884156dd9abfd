-- send: store every message or none. Deduplication is planned by the client from the
-- queue's dedup entries (rules.plan_dedup); this script checks the plan still holds.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 n messages, then per message 6 values: delay, priority,
--       group ("" none), attributes JSON ("" none), body, dedup id ("" none);
--       then m, and m pairs (dedup id, id it answers with) of duplicates of earlier sends
-- returns the new ids | error FQ:NOQUEUE, FQ:FULL, FQ:PRIO, FQ:STALE (plan out of date)
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local ids, err = send_messages(q, 2)
if err then finish(); return err end
finish()
return ids
