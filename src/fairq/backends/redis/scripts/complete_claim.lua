-- complete_claim: mark the key completed with `result` for `ttl` seconds, if the record is
-- still `token`'s (even past its lease) or there is none.
-- KEYS[1] the record
-- ARGV: header; 1 token, 2 ttl, 3 "1" if a result follows, 4 result
-- returns 1 | 0 (another claim has the key)
local key, token = KEYS[1], arg(1)
local rec = rec_live(key)
if rec and rec.t ~= token then return 0 end
local until_ = NOW + narg(2)
redis.call('HSET', key, 't', token, 's', '1', 'e', string.format('%.6f', until_))
if arg(3) == '1' then redis.call('HSET', key, 'r', arg(4)) else redis.call('HDEL', key, 'r') end
rec_keep(key, until_)
return 1
