-- topic_read: what a publisher needs to plan a publish: the version of the topic's
-- subscriptions, its options and the subscriptions (name, JSON pairs).
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic, 2 the version the caller has (-1 none)
-- returns {version, options JSON, name, subscription JSON, ...}; {version} alone when the
-- caller's version is current | error FQ:NOTOPIC
local topic = arg(1)
local raw = redis.call('HGET', fbase_of(topic) .. 'topics', topic)
if not raw then return fail('NOTOPIC', topic) end
local v = topic_version(topic)
if v == narg(2) then return {v} end
local out = {v, raw}
local subs = redis.call('HGETALL', tkey(topic, 'subs'))
for i = 1, #subs do out[#out + 1] = subs[i] end
return out
