--[[
Read a ticket, ending it `expired` first when it is still queued past its deadline, so a read never
reports a dead ticket as alive, whether or not a reaper has swept yet. The same end as the reaper's
(unqueued, counted, callback handed to the outbox), in one atomic step.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] pending zset            {q}:pending
KEYS[3] delayed zset            {q}:delayed
KEYS[4] deadlines zset          {q}:deadlines
KEYS[5] counts hash             {q}:counts
KEYS[6] outbox list             {q}:outbox
KEYS[7..6+n] waiting zset of each type, in the order of ARGV[5..]
KEYS[7+n..6+2n] branch depth hash of each type, same order
KEYS[7+2n..6+3n] branch tokens hash of each type, same order

ARGV[1] ticket id
ARGV[2] now (Unix seconds)
ARGV[3] retention spec (shared/policy.py `retention_spec`)
ARGV[4] n, the number of types
ARGV[5..4+n] type names

Returns the ticket hash as a flat field/value list (HGETALL), empty when there is no such ticket.
]]
-- @include tickets

local t = redis.call('HMGET', KEYS[1], 'status', 'type', 'expires_at', 'branch_id', 'weighted_tokens')
if t[1] == 'queued' and tonumber(t[3]) and tonumber(t[3]) <= tonumber(ARGV[2]) then
  local waiting = waiting_keys(7, 5, tonumber(ARGV[4]))
  local depths = waiting_keys(7 + tonumber(ARGV[4]), 5, tonumber(ARGV[4]))
  local branch_tokens = waiting_keys(7 + 2 * tonumber(ARGV[4]), 5, tonumber(ARGV[4]))
  unqueue(ARGV[1], KEYS[2], KEYS[3], KEYS[4], waiting[t[2]] or KEYS[2], depths[t[2]], branch_tokens[t[2]],
    t[4], t[5])
  finish_ticket(KEYS[1], ARGV[1], t[2], 'expired', ARGV[2], ARGV[3], 'TTL passed while queued',
    KEYS[5], KEYS[6])
end
return redis.call('HGETALL', KEYS[1])
