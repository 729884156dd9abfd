-- extend_claim: make `token`'s running record last `lease` seconds from now (taking the
-- key again if its record is gone).
-- KEYS[1] the record
-- ARGV: header; 1 token, 2 lease
-- returns 1 | 0 (another claim holds or completed it)
local key, token = KEYS[1], arg(1)
local rec = rec_live(key)
local until_ = NOW + narg(2)
if rec and (rec.t ~= token or rec.s ~= '0') then return 0 end
if not rec then redis.call('HSET', key, 't', token, 's', '0') end
redis.call('HSET', key, 'e', string.format('%.6f', until_))
rec_keep(key, until_)
return 1
