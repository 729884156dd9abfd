-- send: store every message or none. Deduplication is planned by the client from the
-- queue's dedup entries (rules.plan_dedup); this script checks the plan still holds.
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 n messages, then per message 6 values: delay, priority,
--       group ("" none), attributes JSON ("" none), body, dedup id ("" none);
--       then m, and m pairs (dedup id, id it answers with) of duplicates of earlier sends
-- returns the new ids | error FQ:NOQUEUE, FQ:FULL, FQ:PRIO, FQ:STALE (plan out of date)
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local n = narg(2)
local items, dedups = {}, {}
for i = 0, n - 1 do
  local o = 3 + i * 6
  local prio = tonumber(arg(o + 1))
  if prio > q.maxp then finish(); return fail('PRIO', q.maxp) end
  local f = {}
  local attrs = arg(o + 3)
  if attrs ~= '' then f[#f + 1] = 'a'; f[#f + 1] = attrs end
  f[#f + 1] = 'b'; f[#f + 1] = arg(o + 4)
  local grp = arg(o + 2)
  items[#items + 1] = {fields = f, delay = tonumber(arg(o)), prio = prio,
                       group = grp ~= '' and grp or nil}
  dedups[#dedups + 1] = arg(o + 5)
end
-- the plan: fresh dedup ids must be unknown (or expired), duplicates still known
local function live(d)
  local v = redis.call('HGET', q.u, d)
  if not v then return nil end
  local id, exp = string.match(v, '^(%x+) (.+)$')
  if tonumber(exp) > NOW then return id end
  redis.call('HDEL', q.u, d); redis.call('ZREM', q.x, d)  -- so the next plan sees it gone
  return nil
end
for _, d in ipairs(dedups) do
  if d ~= '' and live(d) then finish(); return fail('STALE') end
end
local o = 3 + n * 6
for j = 1, narg(o) do
  if live(arg(o + 2 * j - 1)) ~= arg(o + 2 * j) then finish(); return fail('STALE') end
end
local err, victims = plan_room(q, n)
if err then finish(); return err end
apply_room(q, victims)
local ids = insert(q, items)
if q.dedup_window > 0 then
  local exp = NOW + q.dedup_window
  local stale = redis.call('ZRANGEBYSCORE', q.x, '-inf', NOW, 'LIMIT', 0, 100)
  for _, d in ipairs(stale) do redis.call('HDEL', q.u, d); redis.call('ZREM', q.x, d) end
  for i, d in ipairs(dedups) do
    if d ~= '' then
      redis.call('HSET', q.u, d, ids[i] .. ' ' .. string.format('%.6f', exp))
      redis.call('ZADD', q.x, exp, d)
    end
  end
end
finish()
return ids
