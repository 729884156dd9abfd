-- publish: store the copies of a publish in every matching subscription queue — all of
-- them or none. The client matched filters and routing (rules.publish_plan) against the
-- subscriptions of version `version`; a newer version means it planned with old ones.
-- KEYS[1] the family's due index
-- ARGV: header; 1 topic, 2 version, 3 n copies, then per copy 3 values: body, attributes
--       JSON ("" none), delay;
--       then m queues, per queue: name, k, then k copy numbers (1-based);
--       then f, per first use of a dedup id: dedup id, copy number, matched names JSON;
--       then e, per duplicate of an earlier publish: dedup id, the id it answers with
-- returns {listening (0/1), publication ids...} | error FQ:NOTOPIC, FQ:STALE, FQ:FULL
local topic = arg(1)
local fb = fbase_of(topic)
sweep_family(fb)
local raw = redis.call('HGET', fb .. 'topics', topic)
if not raw then finish(); return fail('NOTOPIC', topic) end
if topic_version(topic) ~= narg(2) then finish(); return fail('STALE') end
local n = narg(3)
local o = 4 + n * 3
-- the plan's dedup facts must still hold
local dedup = tkey(topic, 'u')
local function live(d)
  local v = redis.call('HGET', dedup, d)
  if not v then return nil end
  local id, exp = string.match(v, '^(%x+) ([^ ]+) ')
  if tonumber(exp) > NOW then return id end
  redis.call('HDEL', dedup, d); redis.call('ZREM', tkey(topic, 'x'), d)
  return nil
end
local m = narg(o)
local targets = {}
local p = o + 1
for i = 1, m do
  local q = load_queue(arg(p))
  if not q then finish(); return fail('STALE') end
  local k = narg(p + 1)
  local copies = {}
  for j = 1, k do copies[j] = narg(p + 1 + j) end
  targets[i] = {q = q, copies = copies}
  p = p + 2 + k
end
local firsts = {}
for i = 1, narg(p) do
  local d = arg(p + 3 * i - 2)
  if live(d) then finish(); return fail('STALE') end
  firsts[i] = {d, narg(p + 3 * i - 1), arg(p + 3 * i)}
end
p = p + 1 + 3 * narg(p)
for i = 1, narg(p) do
  if live(arg(p + 2 * i - 1)) ~= arg(p + 2 * i) then finish(); return fail('STALE') end
end
-- room in every queue first, so a full one changes nothing
local drops = {}
for i, t in ipairs(targets) do
  local err, victims = plan_room(t.q, #t.copies)
  if err then finish(); return err end
  drops[i] = victims
end
for i, t in ipairs(targets) do apply_room(t.q, drops[i]) end
-- a body copied into several queues is stored once, with a count of its references
local shares = {}
for _, t in ipairs(targets) do
  for _, c in ipairs(t.copies) do shares[c] = (shares[c] or 0) + 1 end
end
local refs = {}
for c, count in pairs(shares) do
  if count > 1 then
    local ref = tostring(redis.call('HINCRBY', fb .. 'ids', 'body', 1))
    redis.call('HSET', fb .. 'b', ref, arg(1 + c * 3))
    redis.call('HSET', fb .. 'bc', ref, count)
    refs[c] = ref
  end
end
local stored = 0
for _, t in ipairs(targets) do
  local items = {}
  for _, c in ipairs(t.copies) do
    local f = {}
    local attrs = arg(2 + c * 3)
    if attrs ~= '' then f[#f + 1] = 'a'; f[#f + 1] = attrs end
    if refs[c] then f[#f + 1] = 'br'; f[#f + 1] = refs[c]
    else f[#f + 1] = 'b'; f[#f + 1] = arg(1 + c * 3) end
    items[#items + 1] = {fields = f, delay = tonumber(arg(3 + c * 3)), prio = 0, ref = refs[c]}
  end
  insert(t.q, items)
  stored = stored + #items
end
local out = {0}
if n > 0 then
  for _, id in ipairs(new_ids(CLUSTER and fb or fb, n)) do out[#out + 1] = id end
end
local window = cjson.decode(raw).dedup_window
if #firsts > 0 and window > 0 then
  local exp = NOW + window
  for _, f in ipairs(firsts) do
    redis.call('HSET', dedup, f[1], out[1 + f[2]] .. ' ' .. string.format('%.6f', exp) .. ' ' .. f[3])
    redis.call('ZADD', tkey(topic, 'x'), exp, f[1])
  end
  local stale = redis.call('ZRANGEBYSCORE', tkey(topic, 'x'), '-inf', NOW, 'LIMIT', 0, 100)
  for _, d in ipairs(stale) do redis.call('HDEL', dedup, d); redis.call('ZREM', tkey(topic, 'x'), d) end
end
local nk = tkey(topic, 'n')
redis.call('HINCRBY', nk, 'published', n)
redis.call('HINCRBY', nk, 'copies', stored)
local matched = {}
for _, t in ipairs(targets) do for _, c in ipairs(t.copies) do matched[c] = true end end
local unmatched = 0
for c = 1, n do if not matched[c] then unmatched = unmatched + 1 end end
redis.call('HINCRBY', nk, 'unmatched', unmatched)
if redis.call('EXISTS', tkey(topic, 'listening')) == 1 then out[1] = 1 end
finish()
return out
