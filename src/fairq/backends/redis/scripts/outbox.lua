-- outbox: drop delivered entries from the head of a family's outbox (Cluster moves into
-- other families; see deliver.lua). Only entries still at the head and named by the
-- caller go, so two processes draining at once never drop an undelivered entry.
-- KEYS[1] the family's outbox list
-- ARGV: header; 1.. the tokens delivered, in outbox order
-- returns how many entries were dropped
local n = 0
local i = 1
while arg(i) do
  local head = redis.call('LINDEX', KEYS[1], 0)
  if not head then break end
  local _, token = string.match(head, '^([^\t]*)\t([^\t]*)\t')
  if token ~= arg(i) then break end
  redis.call('LPOP', KEYS[1])
  n = n + 1
  i = i + 1
end
return n
