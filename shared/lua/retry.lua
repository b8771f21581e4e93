--[[
Give a running ticket back after a transient failure (vLLM refused, timed out, 5xx, OOM): it waits
out a backoff in the delayed set, keeping its place by score, or ends `failed` once it has used
`max_attempts`, or `expired` when its TTL has passed. Only the current lease holder may do this.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] inflight zset           {q}:inflight
KEYS[3] delayed zset            {q}:delayed
KEYS[4] deadlines zset          {q}:deadlines
KEYS[5] waiting zset of type    {q}:waiting:<type>
KEYS[6] counts hash             {q}:counts
KEYS[7] outbox list             {q}:outbox
KEYS[8] pending zset            {q}:pending
KEYS[9] branch depth of type    {q}:branch-depth:<type>
KEYS[10] branch tokens of type  {q}:branch-token-units:<type>

ARGV[1] ticket id
ARGV[2] fencing token from the claim
ARGV[3] now (Unix seconds)
ARGV[4] backoff seconds (0 = straight back into the pending set)
ARGV[5] error text (why this attempt failed)
ARGV[6] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[7] "1" = do not count this attempt (the worker is shutting down, vLLM never saw it)

Returns "retry" | "failed" | "expired", or "stale:<status>" when the caller holds no lease.
]]
-- @include tickets

local id = ARGV[1]
local key = KEYS[1]
local now = tonumber(ARGV[3])
local t = redis.call('HMGET', key, 'status', 'token', 'type', 'attempts', 'max_attempts',
  'expires_at', 'created_at', 'score', 'branch_id', 'weighted_tokens')
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'stale:' .. (t[1] or 'missing')
end
redis.call('ZREM', KEYS[2], id)
local attempts = tonumber(t[4]) or 0
if ARGV[7] == '1' then
  attempts = attempts - 1
  redis.call('HSET', key, 'attempts', attempts)
end
if attempts >= (tonumber(t[5]) or 1) then
  finish_ticket(key, id, t[3], 'failed', ARGV[3], ARGV[6],
    'failed after ' .. attempts .. ' attempts: ' .. ARGV[5], KEYS[6], KEYS[7])
  return 'failed'
end
if tonumber(t[6]) <= now then
  finish_ticket(key, id, t[3], 'expired', ARGV[3], ARGV[6],
    'TTL passed while retrying: ' .. ARGV[5], KEYS[6], KEYS[7])
  return 'expired'
end
redis.call('HSET', key, 'status', 'queued', 'token', '', 'worker', '', 'last_error', ARGV[5])
local backoff = tonumber(ARGV[4])
if backoff > 0 then
  redis.call('ZADD', KEYS[3], now + backoff, id)
else
  redis.call('ZADD', KEYS[8], t[8], id)
end
redis.call('ZADD', KEYS[4], t[6], id)
redis.call('ZADD', KEYS[5], t[7], id)
count_branch(KEYS[9], KEYS[10], t[9], 1, t[10])
return 'retry'
