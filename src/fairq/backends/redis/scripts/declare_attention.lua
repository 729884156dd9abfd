-- declare_attention: create a domain or replace its options (compare-and-set) in the family
-- of one of its shards; the client checks a change (attention_policy.check_change) with
-- what this returns.
-- KEYS[1] the data family's due index (the family of the shard's work queues)
-- ARGV: header; 1 shard id (the domain, or "<domain>#<shard>"), 2 options JSON, 3 the
--       options the caller saw ("" none)
-- returns {'ok'} | {'conflict', current options JSON, the shard has keys (0/1)}
local fb = string.sub(KEYS[1], 1, -4)
local id, config, seen = arg(1), arg(2), arg(3)
local domain = domain_of(id)
local cur = redis.call('HGET', fb .. 'att', domain)
if cur and cur ~= config and cur ~= seen then
  return {'conflict', cur, redis.call('ZCARD', abase(fb, id) .. 'keys') > 0 and 1 or 0}
end
if cur ~= config then redis.call('HSET', fb .. 'att', domain, config) end
return {'ok'}
