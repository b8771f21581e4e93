--[[
Extend a running ticket's lease (the worker's heartbeat), only with the current fencing token.
A failed extension tells the worker to stop: the ticket was cancelled, or its lease was lost.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] inflight zset           {q}:inflight

ARGV[1] ticket id
ARGV[2] fencing token from the claim
ARGV[3] now (Unix seconds)
ARGV[4] lease seconds from now

Returns "ok", or "stale:<status>" (e.g. "stale:cancelled") when the lease is no longer the caller's.
]]

local t = redis.call('HMGET', KEYS[1], 'status', 'token')
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'stale:' .. (t[1] or 'missing')
end
local deadline = tonumber(ARGV[3]) + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'lease_until', deadline)
redis.call('ZADD', KEYS[2], deadline, ARGV[1])
return 'ok'
