-- attention_progress: ack a running slice's handled messages and count the acked ones as
-- processed for its key now. The slice remembers them (A sn: token -> counted), so its end
-- counts only the rest, and when its token expires first the sweep adds them to the
-- domain's processed (end_slice); a slice already ended counts them for the domain here.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id, 2 slice token, 3 key, 4 the slice's work queue ("": nothing to
--       ack, count 5), 5 k (or the number to count), 6 the k receipts in one string
-- returns the positions (1-based) of the receipts that were not current leases
--         | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
local lost, n = {}, 0
if arg(4) == '' then
  n = narg(5)
else
  local q = load_queue(arg(4))
  if q then
    local ok
    ok, lost = current(q, 5)
    ack_messages(q, ok)
    n = #ok
  else
    for i = 1, narg(5) do lost[i] = i end
  end
end
if n > 0 then
  local kk = d.a .. 'k:' .. arg(3)
  if redis.call('EXISTS', kk) == 1 then redis.call('HINCRBY', kk, 'processed', n) end
  if redis.call('HEXISTS', d.a .. 'sk', arg(2)) == 1 then
    redis.call('HINCRBY', d.a .. 'sn', arg(2), n)  -- the domain takes them at the end
  else
    count(d, 'processed', n)  -- ended already (its token expired): the domain's now
  end
end
finish()
return lost
