-- redrive: move up to `limit` messages with ids above `after` (oldest first, not leased or
-- delayed) out of a dead-letter queue, to `to` or back to each one's source queue. On
-- Cluster a target in another family gets its messages through the outbox (deliver.lua).
-- KEYS[1] the family's due index
-- ARGV: header; 1 name, 2 to ("" each one's source), 3 limit, 4 after (id, "" none),
--       5.. queues of other families the caller knows exist (Cluster)
-- returns {moved, last id looked at or "" when nothing is left, queues of other families
--          this chunk would move to that the caller did not name (it checks them and
--          asks again)}
sweep_family(fbase_of(arg(1)))
local q = load_queue(arg(1))
if not q then finish(); return fail('NOQUEUE', arg(1)) end
local to, limit, after = arg(2), narg(3), arg(4)
if to ~= '' and same_slot(q.name, to) and not load_queue(to) then
  finish(); return fail('NOQUEUE', to)
end
local known, unknown, unknown_list = {}, {}, {}
local i = 5
while arg(i) do known[arg(i)] = true; i = i + 1 end
local start = after == '' and '-' or '(' .. sid(after)
local got = redis.call('XRANGE', q.s, start, '+', 'COUNT', limit)
local moved = 0
for _, e in ipairs(got) do
  local id = hex_of_sid(e[1])
  local w = where_is(q, id)
  if w == 'r' or w == 'b' then
    local rec = {}
    for i = 1, #e[2], 2 do rec[e[2][i]] = e[2][i + 1] end
    local target = to ~= '' and to or rec.ds
    if target and target ~= q.name then
      local body = record_body(q, rec)
      local f = {'b', body}
      if rec.a then f[#f + 1] = 'a'; f[#f + 1] = rec.a end
      local orig = rec.o or rec.di
      if orig then f[#f + 1] = 'o'; f[#f + 1] = orig end
      local prio = tonumber(rec.p or 0)
      if not same_slot(q.name, target) then
        if known[target] then
          remove(q, id, w, rec)
          outbox_push(q, target, id, f, prio, rec.g)
          moved = moved + 1
        elseif not unknown[target] then
          unknown[target] = true
          unknown_list[#unknown_list + 1] = target
        end
      else
        local t = load_queue(target)
        if t then
          remove(q, id, w, rec)
          insert(t, {{fields = f, prio = math.min(prio, t.maxp), group = rec.g}})
          moved = moved + 1
        end
      end
    end
  end
end
local last = ''
if #got == limit and #got > 0 then last = hex_of_sid(got[#got][1]) end
finish()
local out = {moved, last}
for _, t in ipairs(unknown_list) do out[#out + 1] = t end
return out
