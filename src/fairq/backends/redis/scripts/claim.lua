-- claim: take the key for `lease` seconds under `token` if it has no live record, or a
-- running one of the same holder (both tokens "@", 16 hex digits, "@", then the holder
-- from character 19: model/idempotency.py's same_holder); else change nothing and answer
-- the live record.
-- KEYS[1] the record
-- ARGV: header; 1 token, 2 lease, 3 fingerprint ("" none)
-- returns {} when taken | {state, expires_at, fingerprint or false, result or false}
local key, token = KEYS[1], arg(1)
local rec = rec_live(key)
local function same_holder(a, b)
  return a:sub(1, 1) == '@' and b:sub(1, 1) == '@' and a:sub(19) == b:sub(19)
end
if rec and rec.e > NOW and not (rec.s == '0' and same_holder(rec.t, token)) then
  return rec_reply(rec)
end
local until_ = NOW + narg(2)
redis.call('DEL', key)
redis.call('HSET', key, 't', token, 's', '0', 'e', string.format('%.6f', until_))
if arg(3) ~= '' then redis.call('HSET', key, 'f', arg(3)) end
rec_keep(key, until_)
return {}
