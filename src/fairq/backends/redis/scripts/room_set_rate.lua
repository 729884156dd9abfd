-- room_set_rate: the admitter's rate, changed live.
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 rate (fans per second)
-- returns {} if there is no room | {1}
local r = room_open_step()
if r == nil then return {} end
rset(r, 'rate', narg(2))
room_save(r)
return {1}
