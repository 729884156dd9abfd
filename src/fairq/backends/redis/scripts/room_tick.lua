-- room_tick: one admission step of the admitter holding the lease (rule 5): take or
-- renew the lease (a new holder gets the next fence), expire lapsed tokens, let in the
-- fans the credit allows (rate, waiting fans, max_active) and record the step.
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 holder, 3 lease seconds
-- returns {} if there is no room | {fence or "", admitted, rate, phase, waiting,
--   holder_until or ""}
local r = room_open_step()
if r == nil then return {} end
local held = room_take_admitter(r, arg(2), narg(3))
local n = 0
if held then
  room_expire(r)
  n = room_allowance(r)
  room_note_admitted(r, n)
end
room_save(r)
return room_tick_result(r, held, n)
