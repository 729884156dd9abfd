-- delete_attention: delete the domain's keys, tenants, signals, slices and usage history
-- (not the work queues).
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain
-- returns 1 if it existed, else 0
local fb = string.sub(KEYS[1], 1, -4)
local d = load_domain(fb, arg(1))
if not d then return 0 end
local a = d.a
for _, key in ipairs(redis.call('ZRANGE', a .. 'keys', 0, -1)) do
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
redis.call('DEL', a .. 'n', a .. 'keys', a .. 'backlog', a .. 'sched', a .. 'tenants',
  a .. 'delayed', a .. 'slices', a .. 'sk', a .. 'sc', a .. 'ub', a .. 'turns', a .. 'tturn')
redis.call('HDEL', fb .. 'att', arg(1))
return 1
