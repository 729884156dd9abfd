-- idempotency_record: the key's live record.
-- KEYS[1] the record
-- ARGV: header; 1 "forget" to delete it too
-- returns {} (none live) | {state, expires_at, fingerprint or false, result or false}
local rec = rec_live(KEYS[1])
if arg(1) == 'forget' then redis.call('DEL', KEYS[1]) end
if not rec or rec.e <= NOW then return {} end
return rec_reply(rec)
