-- purge: delete every message of the queue (visible, delayed, in flight); counters and
-- dedup entries stay.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name
-- returns how many messages were deleted
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local n = redis.call('XLEN', q.s)
local refs = redis.call('HVALS', q.y)
for _, ref in ipairs(refs) do unref_body(q.fb, ref) end
for _, grp in ipairs(redis.call('HKEYS', q.h)) do redis.call('DEL', q.b .. 'g:' .. grp) end
redis.call('DEL', q.s, q.r, q.d, q.l, q.a, q.k, q.h, q.v, q.y)
redis.call('HSET', q.n, 'blocked', 0)
touch(q)
wake(q.name)
finish()
return n
