--[[
Cancel a ticket on its branch's request. A queued ticket leaves the queue; a running one loses its
lease (its worker sees the stale token at its next lease renewal, within a second, and aborts the
vLLM request). An ended ticket keeps its outcome. One round trip: every type's waiting zset is
declared, since the ticket's type is only known once its hash is read.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] pending zset            {q}:pending
KEYS[3] delayed zset            {q}:delayed
KEYS[4] deadlines zset          {q}:deadlines
KEYS[5] inflight zset           {q}:inflight
KEYS[6] counts hash             {q}:counts
KEYS[7] outbox list             {q}:outbox
KEYS[8..7+n] waiting zset of each type, in the order of ARGV[6..]
KEYS[8+n..7+2n] branch depth hash of each type, same order
KEYS[8+2n..7+3n] branch tokens hash of each type, same order

ARGV[1] ticket id
ARGV[2] now (Unix seconds)
ARGV[3] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[4] reason
ARGV[5] n, the number of types
ARGV[6..5+n] type names

Returns the status before the call ("queued" or "running" mean it is now cancelled), or "missing".
]]
-- @include tickets

local t = redis.call('HMGET', KEYS[1], 'status', 'type', 'branch_id', 'weighted_tokens')
if not t[1] then return 'missing' end
if t[1] == 'queued' or t[1] == 'running' then
  local waiting = waiting_keys(8, 6, tonumber(ARGV[5]))
  local depths = waiting_keys(8 + tonumber(ARGV[5]), 6, tonumber(ARGV[5]))
  local branch_tokens = waiting_keys(8 + 2 * tonumber(ARGV[5]), 6, tonumber(ARGV[5]))
  unqueue(ARGV[1], KEYS[2], KEYS[3], KEYS[4], waiting[t[2]] or KEYS[2], depths[t[2]], branch_tokens[t[2]],
    t[3], t[4])
  redis.call('ZREM', KEYS[5], ARGV[1])
  finish_ticket(KEYS[1], ARGV[1], t[2], 'cancelled', ARGV[2], ARGV[3], ARGV[4], KEYS[6], KEYS[7])
end
return t[1]
