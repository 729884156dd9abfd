-- topic.lua: topics and their subscriptions. A topic's keys are in its family; so are its
-- subscription queues ("<topic>.<name>"), so a publish stores every copy in one slot.
--   F topics   hash topic -> options JSON        F tv   hash topic -> version of its subs
--   F t:<topic>:subs  hash name -> subscription JSON   F subq  hash queue -> topic TAB name
--   F t:<topic>:n  counters   F t:<topic>:u / :x  dedup entries and their expiry
--   F t:<topic>:listening  set while some process listens (Topic.listen)
local function tkey(topic, suffix) return fbase_of(topic) .. 't:' .. topic .. ':' .. suffix end

local function topic_version(topic)
  return tonumber(redis.call('HGET', fbase_of(topic) .. 'tv', topic) or 0)
end

local function bump_topic(topic) redis.call('HINCRBY', fbase_of(topic) .. 'tv', topic, 1) end

local function topic_exists(topic)
  return redis.call('HEXISTS', fbase_of(topic) .. 'topics', topic) == 1
end
