--[[
Preempt a running ticket so a critical one waiting at a full worker can start now: the ticket goes
straight back to the pending set at its original score, its attempt not counted, with one more
preemption on its record. A ticket that has been preempted `max` times already is left running
(nothing changes), and one whose TTL has passed ends `expired`. Only the current lease holder may
do this (the claim's fencing token), so a taken-over ticket is never put back twice.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] inflight zset           {q}:inflight
KEYS[3] pending zset            {q}:pending
KEYS[4] deadlines zset          {q}:deadlines
KEYS[5] waiting zset of type    {q}:waiting:<type>
KEYS[6] branch depth of type    {q}:branch-depth:<type>
KEYS[7] counts hash             {q}:counts
KEYS[8] outbox list             {q}:outbox
KEYS[9] wake list               {q}:wake
KEYS[10] branch tokens of type  {q}:branch-token-units:<type>

ARGV[1] ticket id
ARGV[2] fencing token from the claim
ARGV[3] now (Unix seconds)
ARGV[4] most preemptions a ticket may take
ARGV[5] why (stored as `last_error`)
ARGV[6] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[7] wake list cap

Returns "requeued" | "exhausted" (preempted `max` times: still running) | "expired",
or "stale:<status>" when the caller holds no lease.
]]
-- @include tickets
-- @include fairness

local id = ARGV[1]
local key = KEYS[1]
local now = tonumber(ARGV[3])
local t = redis.call('HMGET', key, 'status', 'token', 'type', 'attempts', 'preemptions',
  'expires_at', 'created_at', 'score', 'branch_id', 'weighted_tokens')
if t[1] ~= 'running' or t[2] ~= ARGV[2] then
  return 'stale:' .. (t[1] or 'missing')
end
local preemptions = tonumber(t[5]) or 0
if preemptions >= tonumber(ARGV[4]) then
  return 'exhausted'
end
redis.call('ZREM', KEYS[2], id)
if tonumber(t[6]) <= now then
  finish_ticket(key, id, t[3], 'expired', ARGV[3], ARGV[6],
    'TTL passed while running; preempted', KEYS[7], KEYS[8])
  return 'expired'
end
redis.call('HSET', key, 'status', 'queued', 'token', '', 'worker', '', 'last_error', ARGV[5],
  'attempts', math.max((tonumber(t[4]) or 1) - 1, 0), 'preemptions', preemptions + 1)
redis.call('ZADD', KEYS[3], t[8], id)
index_pending(KEYS[6], t[9], id, t[8])
redis.call('ZADD', KEYS[4], t[6], id)
if redis.call('ZADD', KEYS[5], t[7], id) == 1 then
  count_branch(KEYS[6], KEYS[10], t[9], 1, t[10])
end
wake_workers(KEYS[9], 1, tonumber(ARGV[7]))
return 'requeued'
