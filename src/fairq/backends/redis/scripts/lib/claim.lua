-- claim.lua: one idempotency record per key (a hash: t token, s 0 running / 1 completed,
-- f fingerprint, r result, e expires_at). A record past e counts as absent; Redis's own
-- expiry (e plus a minute, relative, so any clock works) only frees the memory.
local function rec_live(key)
  local r = redis.call('HMGET', key, 't', 's', 'e', 'f', 'r')
  if not r[1] then return nil end
  return {t = r[1], s = r[2], e = tonumber(r[3]), f = r[4], r = r[5]}
end
local function rec_reply(rec)
  return {rec.s == '1' and 'completed' or 'running', tostring(rec.e), rec.f or false,
    rec.r or false}
end
local function rec_keep(key, until_)
  redis.call('PEXPIRE', key, math.max(1, math.ceil((until_ - NOW) * 1000)) + 60000)
end
