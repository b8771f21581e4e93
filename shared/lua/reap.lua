--[[
The reaper's sweep, guarded by a short lock so one process sweeps at a time:
  1. running tickets whose lease expired (their worker died or hung) go back to the pending set
     with their original score, or end `failed` after max_attempts, or `expired` past their TTL;
  2. queued tickets whose TTL passed end `expired`;
  3. retries whose backoff is over move from the delayed set to the pending set.

KEYS[1] reaper lock             {q}:reaper-lock
KEYS[2] inflight zset           {q}:inflight
KEYS[3] pending zset            {q}:pending
KEYS[4] delayed zset            {q}:delayed
KEYS[5] deadlines zset          {q}:deadlines
KEYS[6] counts hash             {q}:counts
KEYS[7] outbox list             {q}:outbox
KEYS[8] wake list               {q}:wake
KEYS[9] ticket hash prefix      {q}:t:   (ids are found by the sweep; same hash tag, same slot)
KEYS[10..9+n] waiting zset of each type, in the order of ARGV[7..]
KEYS[10+n..9+2n] branch depth hash of each type, same order
KEYS[10+2n..9+3n] branch tokens hash of each type, same order

ARGV[1] now (Unix seconds)
ARGV[2] lock owner (any unique string)
ARGV[3] lock milliseconds: also the shortest time between two sweeps
ARGV[4] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[5] most tickets handled per step of the sweep
ARGV[6] n, the number of types
ARGV[7..6+n] type names
ARGV[7+n] most wake-up markers the wake list holds

Returns {swept, requeued, failed, expired, promoted}; swept is 0 when another sweep holds the lock.
]]
-- @include tickets
-- @include fairness

if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return {0, 0, 0, 0, 0}
end

local now = tonumber(ARGV[1])
local retention = ARGV[4]
local limit = tonumber(ARGV[5])
local prefix = KEYS[9]
local waiting = waiting_keys(10, 7, tonumber(ARGV[6]))
local depths = waiting_keys(10 + tonumber(ARGV[6]), 7, tonumber(ARGV[6]))
local branch_tokens = waiting_keys(10 + 2 * tonumber(ARGV[6]), 7, tonumber(ARGV[6]))
local requeued, failed, expired, promoted = 0, 0, 0, 0

local lost = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(lost) do
  local key = prefix .. id
  redis.call('ZREM', KEYS[2], id)
  local t = redis.call('HMGET', key, 'status', 'type', 'attempts', 'max_attempts', 'expires_at',
    'created_at', 'score', 'worker', 'branch_id', 'weighted_tokens')
  if t[1] == 'running' then
    local attempts = tonumber(t[3]) or 0
    if attempts >= (tonumber(t[4]) or 1) then
      finish_ticket(key, id, t[2], 'failed', ARGV[1], retention,
        'lease expired on attempt ' .. attempts .. ' of ' .. t[4] .. ' (worker ' .. (t[8] or '?') ..
        ' stopped renewing it)', KEYS[6], KEYS[7])
      failed = failed + 1
    elseif tonumber(t[5]) <= now then
      finish_ticket(key, id, t[2], 'expired', ARGV[1], retention,
        'TTL passed after worker ' .. (t[8] or '?') .. ' lost its lease', KEYS[6], KEYS[7])
      expired = expired + 1
    else
      redis.call('HSET', key, 'status', 'queued', 'token', '', 'worker', '',
        'last_error', 'lease expired (worker ' .. (t[8] or '?') .. ' stopped renewing it)')
      redis.call('ZADD', KEYS[3], t[7], id)
      index_pending(depths[t[2]], t[9], id, t[7])
      redis.call('ZADD', KEYS[5], t[5], id)
      if waiting[t[2]] and redis.call('ZADD', waiting[t[2]], t[6], id) == 1 then
        count_branch(depths[t[2]], branch_tokens[t[2]], t[9], 1, t[10])
      end
      requeued = requeued + 1
    end
  end
end

local stale = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, limit)
for _, id in ipairs(stale) do
  local key = prefix .. id
  local t = redis.call('HMGET', key, 'status', 'type', 'branch_id', 'weighted_tokens')
  unqueue(id, KEYS[3], KEYS[4], KEYS[5], waiting[t[2] or ''] or KEYS[3], depths[t[2] or ''],
    branch_tokens[t[2] or ''], t[3], t[4])
  if t[1] == 'queued' then
    finish_ticket(key, id, t[2], 'expired', ARGV[1], retention, 'TTL passed while queued',
      KEYS[6], KEYS[7])
    expired = expired + 1
  end
end

local moved = promote_due(KEYS[4], KEYS[3], prefix, now, limit)
index_promoted(moved, prefix, depths)
promoted = #moved

if requeued + promoted > 0 then
  wake_workers(KEYS[8], requeued + promoted, tonumber(ARGV[7 + tonumber(ARGV[6])]))
end
return {1, requeued, failed, expired, promoted}
