-- room_consume: burn the token of arrival seq once (the gateway's check at purchase).
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 seq, 3-5 hint (seed, size, place; "" none)
-- returns {} if there is no room | {outcome} ("ok", "used", "expired", "not_admitted") |
--   {"NEEDPLACE", seed, size}
local r = room_open_step()
if r == nil then return {} end
local outcome = room_consume(r, narg(2), room_hint(3))
local out
if outcome == nil then out = room_needplace(r) else out = {outcome} end
room_save(r)
return out
