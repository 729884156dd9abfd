-- delete_attention: delete one shard's keys, tenants, signals, slices and usage history
-- (not the work queues), and with the last shard of a family the domain's options there.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id (the domain, or "<domain>#<shard>"), 2 "1": also delete the
--       domain's options in this family
-- returns 1 if the domain's options were in this family, else 0
local fb = string.sub(KEYS[1], 1, -4)
local id = arg(1)
local a = abase(fb, id)
for _, key in ipairs(redis.call('ZRANGE', a .. 'keys', 0, -1)) do
  local queue = redis.call('HGET', a .. 'k:' .. key, 'queue')
  local q = queue and load_queue(queue)
  if q then redis.call('HDEL', q.n, 'att') end
  redis.call('DEL', a .. 'k:' .. key, a .. 'kd:' .. key)
end
for _, tenant in ipairs(redis.call('SMEMBERS', a .. 'tenants')) do
  redis.call('DEL', a .. 't:' .. tenant, a .. 'T:' .. tenant)
end
for _, b in ipairs(redis.call('ZRANGE', a .. 'ub', 0, -1)) do redis.call('DEL', a .. 'u:' .. b) end
-- a domain written before the scheduler: its tenants' lists by its old indexes
for _, tenant in ipairs(redis.call('HKEYS', a .. 'tturn')) do redis.call('DEL', a .. 't:' .. tenant) end
for _, tenant in ipairs(redis.call('ZRANGE', a .. 'turns', 0, -1)) do
  redis.call('DEL', a .. 't:' .. tenant)
end
redis.call('DEL', a .. 'n', a .. 'keys', a .. 'backlog', a .. 'recon', a .. 'sched', a .. 'tenants',
  a .. 'delayed', a .. 'slices', a .. 'sk', a .. 'sc', a .. 'sn', a .. 'ub', a .. 'turns', a .. 'tturn')
if arg(2) == '1' then return redis.call('HDEL', fb .. 'att', domain_of(id)) end
return redis.call('HEXISTS', fb .. 'att', domain_of(id))
