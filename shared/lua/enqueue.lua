--[[
Submit one ticket: either queue it (ticket hash, priority entry, TTL index, per-type index) or record
it as `rejected` — because admission shed it (ARGV[10]), its type's queue cap is full, or its
branch holds its fair share of the cap while other branches wait — in one step. The rejected record
is lean (no prompt, no words: readers look them up from the code, and short values keep the hash in
Redis's compact encoding) and has its own retention; a retry under the same idempotency key reuses
the record an earlier shed try left instead of writing another.

KEYS[1] ticket hash             {q}:t:<id>
KEYS[2] pending zset            {q}:pending
KEYS[3] deadlines zset          {q}:deadlines
KEYS[4] waiting zset of type    {q}:waiting:<type>
KEYS[5] idempotency key         {q}:idem:<branch>:<key> (untouched when ARGV[6] is "")
KEYS[6] counts hash             {q}:counts
KEYS[7] wake list               {q}:wake
KEYS[8] delayed zset            {q}:delayed
KEYS[9] ticket hash prefix      {q}:t:   (the record an idempotency key names; same hash tag)
KEYS[10] branch depth of type   {q}:branch-depth:<type> (branch → its queued tickets of the type)
KEYS[11] shed counts of the minute {q}:sheds:<minute>  ("<type>:<code>" → count; lives ARGV[13])

ARGV[1]  ticket id
ARGV[2]  ticket type
ARGV[3]  sorted-set score (shared/scoring.py)
ARGV[4]  created_at (Unix seconds)
ARGV[5]  expires_at (Unix seconds)
ARGV[6]  idempotency key, "" for none
ARGV[7]  cap: most queued tickets of this type
ARGV[8]  seconds an accepted ticket's idempotency key lives (its longest retention)
ARGV[9]  ready_at: when later than created_at the ticket is deferred (parked in the delayed set)
ARGV[10] shed code admission decided (shared/shed.py), "" when it admitted the ticket
ARGV[11] words for that code
ARGV[12] words for the cap's code, used when the cap refuses the ticket
ARGV[13] seconds a rejected record (and its idempotency key) lives
ARGV[14] Retry-After seconds a rejected submitter is told
ARGV[15] most wake-up markers the wake list holds
ARGV[16] n: the first n field/value pairs below are the lean record's
ARGV[17..] field, value pairs of the ticket hash (the lean ones first)

Fair share: while other branches have queued tickets of the type, a branch holding cap ÷ (waiting
branches) of them is refused (code branch_share_exceeded, words left to the caller); a branch below
its share is admitted even past the cap, up to twice the cap, so one branch's flood cannot lock the
others out of a type. Turns: while several branches wait, a new ticket is scored just behind the
type's equal-priority ticket at its round-robin place (lib/tickets.lua `turn_score`), so branches
of equal priority are served in turn instead of a flood first.

Returns {"queued", id} | {"existing", id of the earlier ticket} | {"rejected", id, code, words}.
]]
-- @include tickets

local id = ARGV[1]
local ticket_key = KEYS[1]
local ticket_type = ARGV[2]
local has_idem = ARGV[6] ~= ''

if has_idem then
  local existing = redis.call('GET', KEYS[5])
  if existing then
    if redis.call('HGET', KEYS[9] .. existing, 'status') ~= 'rejected' then
      -- The key expires with the ticket's retention, so it never outlives the ticket it names.
      return {'existing', existing}
    end
    -- An earlier try of this submission was shed: this one takes over its id and record.
    id = existing
    ticket_key = KEYS[9] .. existing
    redis.call('DEL', ticket_key)
  end
end

redis.call('HINCRBY', KEYS[6], ticket_type .. ':submitted', 1)

local branch, priority = nil, nil
for i = 17, #ARGV - 1, 2 do
  if ARGV[i] == 'branch_id' then branch = ARGV[i + 1] end
  if ARGV[i] == 'priority' then priority = ARGV[i + 1] end
end

local code, words = ARGV[10], ARGV[11]
if code == '' then
  code, words = fair_share_verdict(KEYS[4], KEYS[10], branch, tonumber(ARGV[7]), ARGV[12])
end

if code ~= '' then
  local lean_end = 16 + 2 * tonumber(ARGV[16])
  redis.call('HSET', ticket_key, 'id', id, 'status', 'rejected', 'shed_code', code,
    'retry_after', ARGV[14], unpack(ARGV, 17, lean_end))
  redis.call('EXPIRE', ticket_key, ARGV[13])
  if has_idem then
    redis.call('SET', KEYS[5], id, 'EX', ARGV[13])
  end
  redis.call('HINCRBY', KEYS[6], ticket_type .. ':rejected', 1)
  redis.call('HINCRBY', KEYS[11], ticket_type .. ':' .. code, 1)
  redis.call('EXPIRE', KEYS[11], ARGV[13])
  return {'rejected', id, code, words}
end

local deferred = tonumber(ARGV[9]) > tonumber(ARGV[4])
local score = ARGV[3]
if not deferred then
  score = turn_score(KEYS[4], KEYS[2], KEYS[9], KEYS[10], branch, priority, score)
end
redis.call('HSET', ticket_key, 'id', id, 'status', 'queued', 'score', score, unpack(ARGV, 17))
if deferred then
  redis.call('ZADD', KEYS[8], ARGV[9], id)
else
  redis.call('ZADD', KEYS[2], score, id)
end
redis.call('ZADD', KEYS[3], ARGV[5], id)
redis.call('ZADD', KEYS[4], ARGV[4], id)
count_branch(KEYS[10], branch, 1)
if has_idem then
  redis.call('SET', KEYS[5], id, 'EX', ARGV[8])
end
wake_workers(KEYS[7], 1, tonumber(ARGV[15]))
return {'queued', id}
