-- delete_topic: delete the topic, its subscriptions and their queues.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic
-- returns 1 if it existed, else 0
local topic = arg(1)
if not topic_exists(topic) then return 0 end
local names = redis.call('HKEYS', tkey(topic, 'subs'))
for _, name in ipairs(names) do
  local q = load_queue(topic .. '.' .. name)
  if q then drop_queue(q) end
end
local fb = fbase_of(topic)
redis.call('DEL', tkey(topic, 'subs'), tkey(topic, 'n'), tkey(topic, 'u'), tkey(topic, 'x'))
redis.call('HDEL', fb .. 'topics', topic)
bump_topic(topic)
publish_wakes()
return 1
