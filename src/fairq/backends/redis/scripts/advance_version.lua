-- advance_version: store `version` for the entity if it is greater than the stored one.
-- Integers are compared exactly as decimal strings (64-bit, beyond a double's 53 bits);
-- an integer against a float as numbers.
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
if cur then
  local ck, ct = string.sub(cur, 1, 1), string.sub(cur, 3)
  local greater
  if ck == 'i' and kind == 'i' then greater = int_gt(text, ct)
  else greater = tonumber(text) > tonumber(ct) end
  if not greater then return 0 end
end
redis.call('SET', KEYS[1], kind .. ':' .. text)
return 1
