-- attention_next: a cheap look (no write) at whether a take would find a ready signal, else
-- when one comes due — the earliest delayed signal, or the earliest slice lease end (which
-- may free a key). Needs none of the libraries: a few reads of the domain's indexes.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 the shard id (the domain, or "<domain>#<shard>")
-- returns {1, count, tenant, vt, ...} (ready: how many tenants have a ready signal, the
--         first 8 with their virtual times) | {1} (no such domain: the take that follows
--         says so) | {0, due or ""}
local fb = string.sub(KEYS[1], 1, -4)
local id = arg(1)
if redis.call('HEXISTS', fb .. 'att', string.match(id, '^[^#]*')) == 0 then return {1} end
local a = fb .. 'a:' .. id .. ':'
local top = redis.call('ZRANGE', a .. 'sched', 0, 7, 'WITHSCORES')
if top[1] then
  local out = {1, redis.call('ZCARD', a .. 'sched')}
  for i = 1, #top, 2 do
    out[#out + 1] = string.sub(top[i], 33)
    out[#out + 1] = top[i + 1]
  end
  return out
end
local due, at = nil, ''
for _, index in ipairs({'delayed', 'slices'}) do
  local first = redis.call('ZRANGE', a .. index, 0, 0, 'WITHSCORES')
  if first[2] and (due == nil or tonumber(first[2]) < due) then
    due, at = tonumber(first[2]), first[2]
  end
end
return {0, at}
