-- advance_version: store `version` for the entity if it is greater than the stored one.
-- Integers are compared exactly as decimal strings (64-bit, beyond a double's 53 bits);
-- an integer against a float as numbers, and exactly when they are equal as doubles (the
-- float is then integral: its exact decimal against the integer's).
-- KEYS[1] the entity's version key (a string "i:<int>" or "f:<float>")
-- ARGV: header; 1 kind ("i" or "f"), 2 the version's text
-- returns 1 (stored) | 0
local kind, text = arg(1), arg(2)
local cur = redis.call('GET', KEYS[1])
local function int_gt(a, b)  -- a > b for decimal integer strings
  local na, nb = string.sub(a, 1, 1) == '-', string.sub(b, 1, 1) == '-'
  if na ~= nb then return nb end
  local ma, mb = na and string.sub(a, 2) or a, nb and string.sub(b, 2) or b
  local gt
  if #ma ~= #mb then gt = #ma > #mb else gt = ma > mb end
  if ma == mb then return false end
  if na then return not gt end
  return gt
end
local function exact(k, t, n)  -- the decimal integer string of an integral version
  if k == 'i' then return t end
  local s = string.format('%.0f', n)
  if s == '-0' then return '0' end
  return s
end
local function version_gt(ak, at, bk, bt)  -- a > b, each of kind 'i' or 'f'
  if ak == 'i' and bk == 'i' then return int_gt(at, bt) end
  local a, b = tonumber(at), tonumber(bt)
  if a ~= b then return a > b end
  if ak == bk then return false end  -- two equal floats
  return int_gt(exact(ak, at, a), exact(bk, bt, b))
end
if cur then
  local ck, ct = string.sub(cur, 1, 1), string.sub(cur, 3)
  if not version_gt(kind, text, ck, ct) then return 0 end
end
redis.call('SET', KEYS[1], kind .. ':' .. text)
return 1
