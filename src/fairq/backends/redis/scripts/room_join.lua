-- room_join: give each new fan the next arrival number (a fan already in keeps its own,
-- rule 1) and answer where each stands; in a sold-out or closed room store nothing.
-- KEYS[1] the room's row ({r:<room>}:row); the other keys share its hash tag
-- ARGV: header; 1 a fresh 32-byte draw seed (used if this step draws), 2.. fan ids
-- returns {} if there is no room | {draw seed or "", pre-queue size, phase, head, eta rate,
--   opens_at or "", then per fan: its seq when it is in the pre-queue (phase scheduled)
--   or waiting at place seq (the client makes the Place from these numbers, as
--   room_place would), else the 7 values of room_place as one nested reply, or
--   {"NEEDPLACE", seq} when its place needs the permutation (the client asks
--   room_status with a hint)}
local r = room_open_step()
if r == nil then return {} end
local ph = room_phase(r)
local out = {r.draw_seed or '', r.pre_queue, ph, 0, f17(room_eta_rate(r)),
  opt17(r.cfg.opens_at)}
local i = 2
if ph == 'sold_out' or ph == 'closed' then
  local p = room_place(r, 0, nil)
  while arg(i) do
    out[#out + 1] = p
    i = i + 1
  end
else
  local fans = r._base .. 'fans'
  while arg(i) do
    local fan = arg(i)
    local seq = tonumber(redis.call('HGET', fans, fan))
    if not seq then
      seq = r.joined + 1
      rset(r, 'joined', seq)
      redis.call('HSET', fans, fan, seq)
    end
    if ph == 'scheduled' or (seq > r.head and (seq > r.pre_queue or not r.draw_seed)) then
      out[#out + 1] = seq
    else
      out[#out + 1] = room_place(r, seq, nil) or {'NEEDPLACE', seq}
    end
    i = i + 1
  end
end
room_save(r)
out[4] = r.head
return out
