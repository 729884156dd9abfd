-- room_admit: let in up to n waiting fans now (outside the admitter's rate).
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 n
-- returns {} if there is no room | {admitted}
local r = room_open_step()
if r == nil then return {} end
local k = 0
if room_phase(r) == 'open' then
  k = math.min(narg(2), room_waiting(r))
  room_note_admitted(r, k)
end
room_save(r)
return {k}
