-- delete_queue: delete the queue, its messages and dedup entries, and the subscription it
-- is the queue of.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name
-- returns 1 if it existed, else 0
local q = load_queue(arg(1))
if not q then return 0 end
for _, ref in ipairs(redis.call('HVALS', q.y)) do unref_body(q.fb, ref) end
for _, grp in ipairs(redis.call('HKEYS', q.h)) do redis.call('DEL', q.b .. 'g:' .. grp) end
redis.call('DEL', q.s, q.r, q.d, q.l, q.a, q.k, q.h, q.v, q.y, q.n, q.u, q.x)
redis.call('HDEL', q.fb .. 'queues', q.name)
redis.call('ZREM', q.fb .. 'due', q.name)
drop_subscription_of(q)
wake(q.name)
publish_wakes()
return 1
