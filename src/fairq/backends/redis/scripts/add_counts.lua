-- add_counts: add to named counters of one scope (a RabbitMQ backend keeps its queues'
-- counters in its store), all at once.
-- KEYS[1] the scope's counters hash
-- ARGV: header; then pairs: 1 name, 2 amount, 3 name, 4 amount, ...
-- returns 1
local i = 1
while arg(i) do
  redis.call('HINCRBY', KEYS[1], arg(i), arg(i + 1))
  i = i + 2
end
return 1
