-- room_join: give each new fan the next arrival number (a fan already in keeps its own);
-- in a sold-out or closed room store nothing; refuse (NEEDDRAW) while the room is open
-- but its pre-queue not drawn yet, so the draw (room_write.lua) comes first.
-- KEYS[1] the room's row
-- ARGV: header; 1.. fan ids
-- returns {now, row fields and values, seq...} (no seqs when sold out or closed) |
--         {now} if there is no room | error FQ:NEEDDRAW
local base = string.sub(KEYS[1], 1, -4)
local state = redis.call('HMGET', KEYS[1], 'ver', 'closed_at', 'sold_out_at', 'drawn_at', 'config')
if not state[1] then return {tostring(NOW)} end
local out = {tostring(NOW), false}
if not state[2] and not state[3] then
  if not state[4] then
    local opens_at = cjson.decode(state[5]).opens_at
    if opens_at == nil or opens_at == NULL or NOW >= opens_at then return fail('NEEDDRAW') end
  end
  local i = 1
  while arg(i) do
    local fan = arg(i)
    local seq = redis.call('HGET', base .. 'fans', fan)
    if not seq then
      seq = redis.call('HINCRBY', KEYS[1], 'joined', 1)
      redis.call('HSET', base .. 'fans', fan, seq)
    end
    out[#out + 1] = tonumber(seq)
    i = i + 1
  end
end
out[2] = redis.call('HGETALL', KEYS[1])
return out
