-- room_declare: create a room, or apply options to it (an opens_at that moves after the
-- draw is refused: CONFLICT). Options are validated by the client (RoomConfig.validated,
-- field by field, so over the defaults or over the stored config alike).
-- KEYS[1] the room's row
-- ARGV: header; 1 draw seed, 2 options given (JSON object, validated), 3 the full config
--   of a new room (JSON), 4 kid of the room's secret ("" none: use 5, 6), 5 generated key
--   seed, 6 its kid
-- returns {now, row fields and values} | error FQ:CONFLICT
local function num_or_null(v)
  if v == nil then return 'null' end
  return f17(v)
end
local function config_json(c)
  local max_active = 'null'
  if c.max_active ~= nil then max_active = string.format('%d', c.max_active) end
  return '{"admit_rate":' .. f17(c.admit_rate) .. ',"token_ttl":' .. f17(c.token_ttl) ..
    ',"opens_at":' .. num_or_null(c.opens_at) .. ',"max_active":' .. max_active .. '}'
end
local r = room_load(KEYS[1])
if r == nil then
  local cfg = cjson.decode(arg(3))
  if cfg.opens_at == NULL then cfg.opens_at = nil end
  if cfg.max_active == NULL then cfg.max_active = nil end
  r = {_key = KEYS[1], _dirty = {}, _base = room_base(KEYS[1]), cfg = cfg}
  for _, f in ipairs(ROOM_ZERO) do r[f] = 0 end
  rset(r, 'config', config_json(cfg))
  rset(r, 'rate', cfg.admit_rate)
  rset(r, 'created_at', NOW)
  rset(r, 'joined', 0)
  if arg(4) ~= '' then rset(r, 'kid', arg(4)) else
    rset(r, 'kid', arg(6)); rset(r, 'key_seed', arg(5))
  end
  room_draw_if_due(r, arg(1))
else
  room_draw_if_due(r, arg(1))
  if arg(4) ~= '' and arg(4) ~= r.kid then  -- another secret: a room's key never changes
    room_save(r)
    return fail('KEY', r.kid)
  end
  local options = cjson.decode(arg(2))
  local cfg = r.cfg
  local new = {admit_rate = cfg.admit_rate, token_ttl = cfg.token_ttl,
    opens_at = cfg.opens_at, max_active = cfg.max_active}
  for _, k in ipairs({'admit_rate', 'token_ttl', 'opens_at', 'max_active'}) do
    local v = options[k]
    if v ~= nil then
      if v == NULL then v = nil end
      new[k] = v
    end
  end
  if options.opens_at ~= nil and r.drawn_at ~= nil and new.opens_at ~= cfg.opens_at then
    room_save(r)
    return fail('CONFLICT')
  end
  r.cfg = new
  rset(r, 'config', config_json(new))
  if options.admit_rate ~= nil then rset(r, 'rate', new.admit_rate) end
end
room_save(r)
return {f17(NOW), room_flat(r)}
