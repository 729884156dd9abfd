-- room_stats: the room's row after expiring lapsed tokens (the client computes the
-- numbers from the row alone, room_policy.stats). room_record: the same without expiring.
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 "1" to expire lapsed tokens first
-- returns {} if there is no room | {now, row fields and values}
local r = room_open_step()
if r == nil then return {} end
if arg(2) == '1' then room_expire(r) end
room_save(r)
return {f17(NOW), room_flat(r)}
