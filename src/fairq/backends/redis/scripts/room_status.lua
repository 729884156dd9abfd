-- room_status: where arrival seq stands (rule 4, rule 8: a few O(log n) commands).
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 seq, 3-5 hint (seed, size, place; "" none)
-- returns {} if there is no room | the 7 values of room_place | {"NEEDPLACE", seed, size}
local r = room_open_step()
if r == nil then return {} end
local p = room_place(r, narg(2), room_hint(3))
if p == nil then p = room_needplace(r) end
room_save(r)
return p
