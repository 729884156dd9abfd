-- release_claim: delete the running record of `token`.
-- KEYS[1] the record
-- ARGV: header; 1 token
-- returns 1 | 0 (not there)
local rec = rec_live(KEYS[1])
if not rec or rec.t ~= arg(1) or rec.s ~= '0' then return 0 end
redis.call('DEL', KEYS[1])
return 1
