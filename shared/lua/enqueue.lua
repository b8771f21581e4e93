--[[
Enqueue one ticket: ticket hash, priority entry, TTL index and per-type index in one step, honouring
the branch's idempotency key and the type's queue cap.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] pending zset            {q}:pending
KEYS[3] deadlines zset          {q}:deadlines
KEYS[4] waiting zset of type    {q}:waiting:<type>
KEYS[5] idempotency key         {q}:idem:<branch>:<key> (untouched when ARGV[6] is "")
KEYS[6] counts hash             {q}:counts
KEYS[7] wake list               {q}:wake
KEYS[8] delayed zset            {q}:delayed

ARGV[1] ticket id
ARGV[2] ticket type
ARGV[3] sorted-set score (shared/scoring.py)
ARGV[4] created_at (Unix seconds)
ARGV[5] expires_at (Unix seconds)
ARGV[6] idempotency key, "" for none
ARGV[7] cap: most queued tickets of this type
ARGV[8] retention seconds (idempotency key and rejected record)
ARGV[9] ready_at: when later than created_at the ticket is deferred (parked in the delayed set)
ARGV[10..] field, value pairs of the ticket hash

Returns {"queued", id} | {"existing", id of the earlier ticket} | {"rejected", id, reason} when the cap is
reached (the ticket is then recorded as `rejected`, never silently dropped).
]]

local id = ARGV[1]
local ticket_type = ARGV[2]

if ARGV[6] ~= '' then
  local existing = redis.call('GET', KEYS[5])
  if existing then
    -- The key expires with the ticket's retention, so it never outlives the ticket it names.
    return {'existing', existing}
  end
end

redis.call('HSET', KEYS[1], unpack(ARGV, 10))
redis.call('HINCRBY', KEYS[6], ticket_type .. ':submitted', 1)

if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[7]) then
  local reason = 'queue cap reached for type ' .. ticket_type .. ' (cap ' .. ARGV[7] .. ')'
  redis.call('HSET', KEYS[1], 'status', 'rejected', 'finished_at', ARGV[4], 'error', reason)
  redis.call('EXPIRE', KEYS[1], ARGV[8])
  redis.call('HINCRBY', KEYS[6], ticket_type .. ':rejected', 1)
  return {'rejected', id, reason}
end

redis.call('HSET', KEYS[1], 'status', 'queued', 'score', ARGV[3])
if tonumber(ARGV[9]) > tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[8], ARGV[9], id)
else
  redis.call('ZADD', KEYS[2], ARGV[3], id)
end
redis.call('ZADD', KEYS[3], ARGV[5], id)
redis.call('ZADD', KEYS[4], ARGV[4], id)
if ARGV[6] ~= '' then
  redis.call('SET', KEYS[5], id, 'EX', ARGV[8])
end
redis.call('LPUSH', KEYS[7], '1')
redis.call('LTRIM', KEYS[7], 0, 63)
return {'queued', id}
