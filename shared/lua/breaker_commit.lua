--[[
Write an endpoint's new breaker state if nobody changed it since the caller read it, and record
each transition as an event. A worker that loses the race re-reads and decides again, so each
transition (a page, above all) is written exactly once however many workers saw it.

KEYS[1] breaker state hash     {q}:breaker:<endpoint>
KEYS[2] breakers set           {q}:breakers
KEYS[3] events stream          {q}:events

ARGV[1] version the caller read (0 for none yet)
ARGV[2] endpoint
ARGV[3] now (Unix seconds)
ARGV[4] events stream max length
ARGV[5] t, the number of transitions
ARGV[6 .. 5+t] transitions ("instant:opened", "deep:on", ...)
ARGV[6+t ..] field, value pairs of the new state

A commit that carries transitions also stamps `changed_at` (ARGV[3]): the moment the breaker's
level or phase last moved, which status shows as "since".

Returns 1 when written, 0 when the version had moved on (nothing written).
]]

local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[1]) then
  return 0
end
local t = tonumber(ARGV[5])
local fields = {}
for i = 6 + t, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], 'version', version + 1, 'endpoint', ARGV[2], 'updated_at', ARGV[3], unpack(fields))
redis.call('SADD', KEYS[2], ARGV[2])
if t > 0 then
  redis.call('HSET', KEYS[1], 'changed_at', ARGV[3])
end
for i = 6, 5 + t do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*',
    'kind', 'breaker', 'at', ARGV[3], 'endpoint', ARGV[2], 'transition', ARGV[i])
end
return 1
