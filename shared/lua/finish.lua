--[[
Finish a running ticket (done, or failed for good) — only for the holder of the current lease.
A worker whose lease expired and was taken over holds a stale token and cannot write an answer.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] inflight zset           {q}:inflight
KEYS[3] counts hash             {q}:counts
KEYS[4] outbox list             {q}:outbox

ARGV[1] ticket id
ARGV[2] fencing token from the claim
ARGV[3] now (Unix seconds)
ARGV[4] final status: "done" or "failed"
ARGV[5] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[6] error text ("" for none)
ARGV[7..] field, value pairs to store (result, usage, first_token_at, ...)

Returns "ok", or "stale:<status>" when the caller no longer holds the lease (nothing is written).
]]
-- @include tickets

local key = KEYS[1]
local t = redis.call('HMGET', key, 'status', 'token', 'type')
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'stale:' .. (t[1] or 'missing')
end
if #ARGV >= 8 then
  redis.call('HSET', key, unpack(ARGV, 7))
end
redis.call('ZREM', KEYS[2], ARGV[1])
finish_ticket(key, ARGV[1], t[3], ARGV[4], ARGV[3], ARGV[5], ARGV[6], KEYS[3], KEYS[4])
return 'ok'
