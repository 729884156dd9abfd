-- declare_queue: create a queue or replace its options (compare-and-set), and create its
-- dead-letter queue if missing. The client decides whether a change is allowed
-- (QueueConfig.check_change) and repeats the call with the options it saw.
-- KEYS[1] the family's due index ({fam}:due) — every key touched shares its hash tag
-- ARGV: header (core.lua); 1 name, 2 options JSON, 3 the options the caller saw ("" none),
--       4 dead-letter queue name ("" none)
-- returns {'ok'} | {'conflict', current options JSON}
local name, config, seen, dlq = arg(1), arg(2), arg(3), arg(4)
local fb = fbase_of(name)
local cur = redis.call('HGET', fb .. 'queues', name)
if cur and cur ~= config and cur ~= seen then return {'conflict', cur} end
if cur ~= config then
  redis.call('HSET', fb .. 'queues', name, config)
  QCACHE[name] = nil
  local q = load_queue(name)
  if cur == false then redis.call('HSETNX', q.n, 'created', tostring(NOW)) end
end
if dlq ~= '' and same_slot(name, dlq) and not load_queue(dlq) then
  local d = create_queue(dlq, DLQ_CONFIG)
  redis.call('HSETNX', d.n, 'created', tostring(NOW))
end
wake(name)  -- blocked senders re-check a new max_length
finish()
return {'ok'}
