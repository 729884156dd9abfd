-- subscribe: create or update a subscription and declare its queue, in one step.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic, 2 subscription name, 3 subscription JSON, 4 queue name,
--       5 queue options JSON, 6 the queue options the caller saw ("" none),
--       7 dead-letter queue ("" none)
-- returns {'ok'} | {'conflict', current queue options JSON} | error FQ:NOTOPIC,
--         FQ:NOTSUB (the queue exists and is not this subscription's)
local topic, name, sub, qname, config, seen, dlq = arg(1), arg(2), arg(3), arg(4), arg(5),
  arg(6), arg(7)
if not topic_exists(topic) then return fail('NOTOPIC', topic) end
local fb = fbase_of(topic)
local subs = tkey(topic, 'subs')
local mine = redis.call('HEXISTS', subs, name) == 1
local cur = redis.call('HGET', fb .. 'queues', qname)
if cur and not mine then return fail('NOTSUB', qname, name) end
if cur and cur ~= config and cur ~= seen then return {'conflict', cur} end
if cur ~= config then
  redis.call('HSET', fb .. 'queues', qname, config)
  QCACHE[qname] = nil
  local q = load_queue(qname)
  if cur == false then redis.call('HSETNX', q.n, 'created', tostring(NOW)) end
end
if dlq ~= '' and same_slot(qname, dlq) and not load_queue(dlq) then
  local d = create_queue(dlq, DLQ_CONFIG)
  redis.call('HSETNX', d.n, 'created', tostring(NOW))
end
if redis.call('HGET', subs, name) ~= sub then
  redis.call('HSET', subs, name, sub)
  redis.call('HSET', fb .. 'subq', qname, topic .. '\t' .. name)
  bump_topic(topic)
end
wake(qname)
finish()
return {'ok'}
