-- unsubscribe: remove a subscription and delete its queue.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic, 2 subscription name
-- returns 1 if there was one, else 0 | error FQ:NOTOPIC
local topic, name = arg(1), arg(2)
if not topic_exists(topic) then return fail('NOTOPIC', topic) end
local raw = redis.call('HGET', tkey(topic, 'subs'), name)
if not raw then return 0 end
local q = load_queue(topic .. '.' .. name)
if q then drop_queue(q) end
redis.call('HDEL', tkey(topic, 'subs'), name)
bump_topic(topic)
publish_wakes()
return 1
