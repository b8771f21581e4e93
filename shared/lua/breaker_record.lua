--[[
Count one inference request's outcome in an endpoint's breaker buckets and read its windows.
Every rung (instant, sustained, deep) counts in its own buckets; each bucket is a hash that
expires after two of its windows, so old counts leave by themselves.

KEYS[1]                breaker state hash        {q}:breaker:<endpoint>
KEYS[2 .. 1+3n]        bucket hashes             {q}:breaker:<endpoint>:<rung>:<index>
                       n per rung, rung by rung; each rung's last key is the current bucket

ARGV[1] outcome: "ok", "err", or "" (only read)
ARGV[2] n, buckets per rung
ARGV[3..5] seconds each rung's buckets live (instant, sustained, deep)

Returns {ok, err} summed per rung (6 integers), then the state hash as a flat field/value list.
]]

local n = tonumber(ARGV[2])
local field = nil
if ARGV[1] == 'ok' then field = 'ok' elseif ARGV[1] == 'err' then field = 'err' end
local out = {}
for r = 0, 2 do
  local current = KEYS[1 + (r + 1) * n]
  if field then
    redis.call('HINCRBY', current, field, 1)
    redis.call('EXPIRE', current, tonumber(ARGV[3 + r]))
  end
  local ok, err = 0, 0
  for i = 1, n do
    local counts = redis.call('HMGET', KEYS[1 + r * n + i], 'ok', 'err')
    ok = ok + (tonumber(counts[1]) or 0)
    err = err + (tonumber(counts[2]) or 0)
  end
  out[#out + 1] = ok
  out[#out + 1] = err
end
out[#out + 1] = redis.call('HGETALL', KEYS[1])
return out
