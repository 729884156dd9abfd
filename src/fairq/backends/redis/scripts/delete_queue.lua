-- delete_queue: delete the queue, its messages and dedup entries, and the subscription it
-- is the queue of.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name
-- returns 1 if it existed, else 0
local q = load_queue(arg(1))
if not q then return 0 end
drop_queue(q)
publish_wakes()
return 1
