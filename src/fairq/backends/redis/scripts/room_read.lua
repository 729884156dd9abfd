-- room_read: a room's row and the index facts the waiting-room rules asked for, in one
-- step, with the time the scripts run at. The rules (backends/room_policy.py) run in the
-- client on this snapshot; room_write.lua stores their outcome only if the row is still
-- this version.
-- KEYS[1] the room's row ({r:<room>}:row); the other keys share its hash tag
-- ARGV: header; then requests, each a kind and one or two numbers:
--   "step" p       the admission step covering place p: upto, admitted_at, expires_at
--   "after" c n    up to n steps after cursor c ("x": the row's expired_upto): upto,
--                  "admitted_at expires_at" pairs
--   "used" s       1 if the token of arrival s was used, else 0
--   "between" a b  how many used tokens sit at places a < place <= b
-- returns {now, row fields and values (flat), answers...} | {now} if there is no room
local base = string.sub(KEYS[1], 1, -4)
local row = redis.call('HGETALL', KEYS[1])
local out = {tostring(NOW)}
if #row == 0 then return out end
out[2] = row
local i = 1
while arg(i) do
  local kind = arg(i)
  if kind == 'step' then
    local got = redis.call('ZRANGEBYSCORE', base .. 'steps', narg(i + 1), '+inf', 'LIMIT', 0, 1)
    if got[1] then
      out[#out + 1] = {got[1], redis.call('HGET', base .. 'stepv', got[1])}
    else out[#out + 1] = {} end
    i = i + 2
  elseif kind == 'after' then
    local cursor = arg(i + 1)
    if cursor == 'x' then cursor = redis.call('HGET', KEYS[1], 'expired_upto') or '0' end
    local got = redis.call('ZRANGEBYSCORE', base .. 'steps', '(' .. cursor, '+inf',
      'LIMIT', 0, narg(i + 2))
    local pairs_ = {}
    for _, upto in ipairs(got) do
      pairs_[#pairs_ + 1] = upto
      pairs_[#pairs_ + 1] = redis.call('HGET', base .. 'stepv', upto)
    end
    out[#out + 1] = pairs_
    i = i + 3
  elseif kind == 'used' then
    out[#out + 1] = redis.call('ZSCORE', base .. 'used', arg(i + 1)) and 1 or 0
    i = i + 2
  elseif kind == 'between' then
    out[#out + 1] = redis.call('ZCOUNT', base .. 'used', '(' .. arg(i + 1), arg(i + 2))
    i = i + 3
  else
    return fail('BADREQ', kind)
  end
end
return out
