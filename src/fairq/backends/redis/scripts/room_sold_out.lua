-- room_sold_out: raise the sold-out flag once (rule 7: no per-fan work); later joins and
-- every status answer sold_out.
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed
-- returns {} if there is no room | {fans who were waiting}
local r = room_open_step()
if r == nil then return {} end
local told = room_sold_out(r)
room_save(r)
return {told}
