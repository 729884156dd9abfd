-- attention_next: a cheap look (no write) at whether a take would find a ready signal, else
-- when one comes due — the earliest delayed signal, or the earliest slice lease end (which
-- may free a key). Needs none of the libraries: a few reads of the domain's indexes.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain
-- returns {1} (ready, or no such domain: the take that follows says so) | {0, due or ""}
local fb = string.sub(KEYS[1], 1, -4)
if redis.call('HEXISTS', fb .. 'att', arg(1)) == 0 then return {1} end
local a = fb .. 'a:' .. arg(1) .. ':'
if redis.call('ZCARD', a .. 'sched') > 0 then return {1} end
local due, at = nil, ''
for _, index in ipairs({'delayed', 'slices'}) do
  local first = redis.call('ZRANGE', a .. index, 0, 0, 'WITHSCORES')
  if first[2] and (due == nil or tonumber(first[2]) < due) then
    due, at = tonumber(first[2]), first[2]
  end
end
return {0, at}
