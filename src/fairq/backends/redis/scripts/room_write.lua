-- room_write: store what the waiting-room rules decided on a snapshot of the row, if the
-- row is still that version (else STALE: read again and decide again). `joined` is
-- never written here (joins move it); a step that depends on it (the draw, sold out)
-- asks for it to be unchanged too.
-- KEYS[1] the room's row
-- ARGV: header; 1 version seen ("" for a new room: create it), 2 joined seen ("" any),
--       3 k fields to set, then k pairs; then j fields to clear; then s admission steps
--       (upto, admitted_at, expires_at); then u used tokens (seq, place)
-- returns 1 | error FQ:STALE
local base = string.sub(KEYS[1], 1, -4)
local ver = redis.call('HGET', KEYS[1], 'ver')
if arg(1) == '' then
  if ver then return fail('STALE') end
elseif ver ~= arg(1) then return fail('STALE') end
if arg(2) ~= '' and (redis.call('HGET', KEYS[1], 'joined') or '0') ~= arg(2) then
  return fail('STALE')
end
local i = 3
local k = narg(i); i = i + 1
for j = 1, k do redis.call('HSET', KEYS[1], arg(i), arg(i + 1)); i = i + 2 end
local c = narg(i); i = i + 1
for j = 1, c do redis.call('HDEL', KEYS[1], arg(i)); i = i + 1 end
local s = narg(i); i = i + 1
for j = 1, s do
  redis.call('ZADD', base .. 'steps', arg(i), arg(i))
  redis.call('HSET', base .. 'stepv', arg(i), arg(i + 1) .. ' ' .. arg(i + 2))
  i = i + 3
end
local u = narg(i); i = i + 1
for j = 1, u do
  if redis.call('ZADD', base .. 'used', 'NX', arg(i + 1), arg(i)) == 0 then
    return fail('STALE')  -- cannot happen: a use changes the row's counters (version)
  end
  i = i + 2
end
redis.call('HINCRBY', KEYS[1], 'ver', 1)
return 1
