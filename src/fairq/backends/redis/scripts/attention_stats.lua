-- attention_stats: the domain's counters, pending signals, running slices and keys.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain
-- returns {counters (flat field/value), pending, slices, keys} | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
-- pending signals: A n's running count; a domain written before the count was kept has
-- none yet: count once (every tenant's list, every delayed set) and keep it from then on
local pending = redis.call('HGET', d.a .. 'n', 'signals')
if pending then
  pending = tonumber(pending)
else
  pending = 0
  for _, m in ipairs(redis.call('ZRANGE', d.a .. 'sched', 0, -1)) do
    pending = pending + redis.call('LLEN', d.a .. 't:' .. string.sub(m, 33))
  end
  for _, key in ipairs(redis.call('ZRANGE', d.a .. 'delayed', 0, -1)) do
    pending = pending + redis.call('ZCARD', d.a .. 'kd:' .. key)
  end
  redis.call('HSET', d.a .. 'n', 'signals', pending)
end
local out = {redis.call('HGETALL', d.a .. 'n'), pending, redis.call('ZCARD', d.a .. 'slices'),
  redis.call('ZCARD', d.a .. 'keys')}
finish()
return out
