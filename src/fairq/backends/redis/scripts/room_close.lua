-- room_close: end the sale (the room stays, every fan is told closed).
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed
-- returns {} if there is no room | {1}
local r = room_open_step()
if r == nil then return {} end
if r.closed_at == nil then rset(r, 'closed_at', NOW) end
room_save(r)
return {1}
