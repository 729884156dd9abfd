-- declare_topic: create a topic or set its options.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic, 2 options JSON
-- returns 1
local topic = arg(1)
local fb = fbase_of(topic)
if redis.call('HGET', fb .. 'topics', topic) ~= arg(2) then
  redis.call('HSET', fb .. 'topics', topic, arg(2))
  redis.call('HSETNX', tkey(topic, 'n'), 'created', tostring(NOW))
  bump_topic(topic)
end
return 1
