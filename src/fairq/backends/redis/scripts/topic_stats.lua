-- topic_stats: a topic's counters and how many subscriptions it has.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic
-- returns {published, copies, unmatched, subscriptions} | error FQ:NOTOPIC
local topic = arg(1)
if not topic_exists(topic) then return fail('NOTOPIC', topic) end
local c = redis.call('HMGET', tkey(topic, 'n'), 'published', 'copies', 'unmatched')
return {tonumber(c[1] or 0), tonumber(c[2] or 0), tonumber(c[3] or 0),
  redis.call('HLEN', tkey(topic, 'subs'))}
