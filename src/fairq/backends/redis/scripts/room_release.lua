-- room_release: give up the admitter lease so a stand-by admitter takes over at once.
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 holder
-- returns 1 released | 0 not the holder or no room
local r = room_open_step()
if r == nil then return 0 end
local done = room_release_admitter(r, arg(2))
room_save(r)
return done and 1 or 0
