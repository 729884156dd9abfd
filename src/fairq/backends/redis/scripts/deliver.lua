-- deliver: the second phase of a move into another family's queue on Redis Cluster
-- (dead letters, redrive): store the entries the source family's outbox holds, once —
-- each entry carries a unique token remembered here for a day, so a delivery repeated
-- after a crash stores nothing twice.
-- KEYS[1] the target family's due index
-- ARGV: header; 1 target queue, 2 DLQ? ("1": create it if missing), then pairs of
--       (token, packed entry)
-- returns how many were stored
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then
  if arg(2) ~= '1' then finish(); return 0 end
  q = create_queue(arg(1), DLQ_CONFIG)
end
local seen = q.fb .. 'delivered'
local stored = 0
local i = 3
while arg(i) do
  local token, entry = arg(i), arg(i + 1)
  if redis.call('ZSCORE', seen, token) == false then
    local e = cmsgpack.unpack(entry)
    local prio, grp = e[2], e[3]
    if grp == false then grp = nil end
    insert(q, {{fields = e[1], prio = math.min(prio, q.maxp), group = grp}})
    redis.call('ZADD', seen, NOW + 86400, token)
    stored = stored + 1
  end
  i = i + 2
end
redis.call('ZREMRANGEBYSCORE', seen, '-inf', NOW)
finish()
return stored
