-- attention_reconcile: signal every active key with backlog, no pending signal and no
-- running slice (a lost signal: work stored in the key's queue past the attention API;
-- SPEC §5 rule 7). It visits the keys such work reached (A recon, noted by the queue
-- scripts) and the keys known to have backlog (A backlog), a chunk per call so no call
-- blocks Redis for long — never the idle keys: an idle domain costs one call per shard.
-- Each key's check and signal is one step.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id, 2 the SSCAN cursor of A backlog ("0" to start), 3 how many
--       keys per set
-- returns {signalled, next cursor or -1 when done, dues (the due times of the delayed
--         signals written, space-separated)} | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local count_ = narg(3)
local n = 0
local function check(key)
  local k = load_key(d, key)
  if k and k.state == 'active' and k.pending == 0 and k.active == 0 then
    local q = load_queue(k.queue)
    if q and depth(q) > 0 then
      local v = key_view(d, k)
      local due = nil
      if v.visible > 0 then due = NOW else due = v.waiting_due end
      if due then
        signal(d, k, due)
        note_backlog(d, k, true)
        save_key(d, k)
        n = n + 1
      end
    end
  end
end
for _, key in ipairs(redis.call('SPOP', d.a .. 'recon', count_)) do check(key) end
local scan = redis.call('SSCAN', d.a .. 'backlog', arg(2), 'COUNT', count_)
for _, key in ipairs(scan[2]) do check(key) end
count(d, 'reconciled', n)
prune_usage(d)
finish()
local nxt = scan[1]
if nxt == '0' and redis.call('SCARD', d.a .. 'recon') == 0 then nxt = -1 end
return {n, nxt, dues()}
