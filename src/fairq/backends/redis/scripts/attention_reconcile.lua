-- attention_reconcile: signal every active key with backlog, no pending signal and no
-- running slice (a lost signal: work stored in the key's queue past the attention API;
-- SPEC §5 rule 7). Each call visits the keys such work reached (A recon, noted by the
-- queue scripts: a chunk per call, until none is left) and the next chunk of the keys
-- with backlog (A backlog, a cursor kept in A n: the safety net, a full round every
-- |backlog| / chunk passes) — never the idle keys, and never all the backlogged keys of a
-- big domain at once. Each key's check and signal is one step.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 shard id, 2 "1" on the pass's first call (visit the backlog chunk),
--       3 how many keys per set
-- returns {signalled, 1 while A recon has more | 0, dues (the due times of the delayed
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
if arg(2) == '1' then
  local at = redis.call('HGET', d.a .. 'n', 'rcursor') or '0'
  local scan = redis.call('SSCAN', d.a .. 'backlog', at, 'COUNT', count_)
  for _, key in ipairs(scan[2]) do check(key) end
  redis.call('HSET', d.a .. 'n', 'rcursor', scan[1])
end
count(d, 'reconciled', n)
prune_usage(d)
finish()
return {n, redis.call('SCARD', d.a .. 'recon') > 0 and 1 or 0, dues()}
