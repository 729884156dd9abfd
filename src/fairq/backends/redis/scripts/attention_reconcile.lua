-- attention_reconcile: signal every active key with backlog, no pending signal and no
-- running slice (a lost signal, e.g. work sent to the queue past the attention API; SPEC
-- §5 rule 7). The keys are visited in slices of the key index so no call blocks Redis
-- for long; each key's check and signal is one step.
-- KEYS[1] the data family's due index
-- ARGV: header; 1 domain, 2 first index in the key index, 3 how many keys
-- returns {signalled, next index or -1 when done, dues (the due times of the delayed
--         signals written, space-separated)} | error FQ:NODOMAIN
local fb = string.sub(KEYS[1], 1, -4)
sweep_family(fb)
local d = load_domain(fb, arg(1))
if not d then finish(); return fail('NODOMAIN', arg(1)) end
sweep_domain(d)
local first, count_ = narg(2), narg(3)
local keys = redis.call('ZRANGE', d.a .. 'keys', first, first + count_ - 1)
local n = 0
for _, key in ipairs(keys) do
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
count(d, 'reconciled', n)
prune_usage(d)
finish()
return {n, #keys < count_ and -1 or first + #keys, dues()}
