--[[
Claim a batch by priority: pop the lowest scores, lease each ticket to this worker with a fresh
fencing token, and end (as `expired`) any whose TTL passed while queued. Due retries are promoted
from the delayed set first. A token budget stops the batch before a ticket whose prompt plus
answer would overflow what the worker's KV cache can hold (priority order is never skipped).
Headroom for critical types: tickets of other types stop at a smaller count and budget (the normal
share), and once that share is full the claim goes on only while the head of the queue is critical,
so a loan arriving at a busy worker still finds a slot without any ticket overtaking another.
Fair share: within the band of the queue's head (its type and priority), the ticket taken is the
first of the waiting branch whose weighted tokens claimed so far are least (lib/fairness.lua), and
each claimed ticket's weighted tokens are counted to its branch. A type's service is read once per
claim and written once at its end (lib/fairness.lua `service_view`).

KEYS[1] pending zset            {q}:pending
KEYS[2] delayed zset            {q}:delayed
KEYS[3] deadlines zset          {q}:deadlines
KEYS[4] inflight zset           {q}:inflight
KEYS[5] counts hash             {q}:counts
KEYS[6] token counter           {q}:token-seq
KEYS[7] outbox list             {q}:outbox
KEYS[8] ticket hash prefix      {q}:t:   (ids are unknown until popped; the prefix carries the
                                          queue's hash tag, so every key stays on one slot)
KEYS[9..8+n] waiting zset of each type, in the order of ARGV[9..]
KEYS[9+n..8+2n] branch depth hash of each type, same order
KEYS[9+2n..8+3n] branch service zset of each type, same order
KEYS[9+3n..8+4n] branch tokens hash of each type, same order

ARGV[1] now (Unix seconds)
ARGV[2] most tickets to claim
ARGV[3] lease seconds
ARGV[4] worker id
ARGV[5] token budget: most prompt+max_tokens to claim; 0 = no budget
ARGV[6] "1" = take the first ticket even when it alone exceeds the budget (the worker is idle)
ARGV[7] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
ARGV[8] n, the number of types
ARGV[9..8+n] type names
ARGV[9+n] most tickets of non-critical types in this claim (≤ ARGV[2])
ARGV[10+n] token budget of non-critical types (≤ ARGV[5]; ignored when ARGV[5] is 0)
ARGV[11+n], ARGV[12+n] weight of a prompt token, of an answer token (max_tokens is charged)
ARGV[13+n] m, then m pairs: branch, its weight (branches not named weigh 1)
ARGV[14+n+2m..] names of the critical types, which may use the whole count and budget

Returns {claimed, expired}: claimed is a list of flat HGETALL arrays of the leased tickets (each
carrying its new `token`); expired counts tickets ended because their TTL passed.
]]
-- @include tickets
-- @include fairness

-- The fields a claim decides on, in the order it reads them (HMGET).
local FIELDS = {'status', 'type', 'expires_at', 'prompt_tokens_estimate', 'max_tokens', 'branch_id',
  'attempts', 'priority', 'weighted_tokens'}
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
-- The lease deadline of every ticket leased here, in the form Redis gives a Lua number (written
-- once rather than converted for each ticket's field and its inflight score).
local lease_until = string.format('%.17g', now + tonumber(ARGV[3]))
local budget = tonumber(ARGV[5])
local retention = ARGV[7]
local prefix = KEYS[8]
local ntypes = tonumber(ARGV[8])
local waiting = waiting_keys(9, 9, ntypes)
local depths = waiting_keys(9 + ntypes, 9, ntypes)
local services = waiting_keys(9 + 2 * ntypes, 9, ntypes)
local branch_tokens = waiting_keys(9 + 3 * ntypes, 9, ntypes)
local normal_limit = tonumber(ARGV[9 + ntypes])
local normal_budget = tonumber(ARGV[10 + ntypes])
local w_in, w_out, weights, critical_at = fairness_weights(11 + ntypes)
local critical = {}
for i = critical_at, #ARGV do
  critical[ARGV[i]] = true
end

index_promoted(promote_due(KEYS[2], KEYS[1], prefix, now, 1000), prefix, depths)

local claimed, nclaimed = {}, 0
local expired = 0
-- Written once at the end instead of a command a ticket: the ids that left the queue (the pending
-- set's removals are also written before that set is read again), the new leases (score, id pairs
-- for the inflight set), the outcome counts of the tickets ended here, the last fencing token handed
-- out (read once, on the first claim) and each type's branch service.
local leaving, leases, ended_counts, views = {}, {}, {}, {}
local nleases = 0
-- Stale entries to drop from the pending set, and how many of `leaving` are out of it already.
local dropped, settled = {}, 0
local function settle_pending()
  remove_all(KEYS[1], leaving, settled + 1)
  remove_all(KEYS[1], dropped)
  settled, dropped = #leaving, {}
end
local last_token
local function next_token()
  last_token = (last_token or tonumber(redis.call('GET', KEYS[6]) or '0')) + 1
  return string.format('%d', last_token)
end
local used = 0
local scanned = 0
-- The head of the queue, read a window at a time: every id read is taken, ended or dropped below
-- before the next, so the window stays the head while the claim runs.
local window, next_in_window = {}, 1
-- The head a fair pick passed over (read once while it stays the head) and the tickets claimed.
local head_id, head_fields, taken = nil, nil, {}
-- Whether several branches wait for a type, read once per claim: a pick between branches is only
-- made then (a branch that is alone gains nothing from it).
local branches_waiting = {}
local function several_waiting(ticket_type)
  if branches_waiting[ticket_type] == nil and depths[ticket_type] then
    branches_waiting[ticket_type] = redis.call('HLEN', depths[ticket_type])
  end
  return (branches_waiting[ticket_type] or 0) > 1
end
local function service_of_type(ticket_type)
  local view = views[ticket_type]
  if not view and services[ticket_type] then
    view = service_view(services[ticket_type])
    views[ticket_type] = view
  end
  return view
end
while nclaimed < limit and scanned < limit + 1000 do
  if next_in_window > #window then
    settle_pending()
    window = redis.call('ZRANGE', KEYS[1], 0, limit - nclaimed)
    next_in_window = 1
  end
  local id = window[next_in_window]
  if not id then break end
  local key = prefix .. id
  local t
  if taken[id] then  -- already claimed here as another branch's turn: nothing to read
    t = {}
  elseif id == head_id then
    t = head_fields
  else
    t = redis.call('HMGET', key, unpack(FIELDS))
  end
  local from_head = true
  -- Queued and within its TTL (a ticket picked instead is queued: lib/fairness.lua `first_pending`).
  local live = t[1] == 'queued' and t[2] and tonumber(t[3]) > now
  if live and several_waiting(t[2]) then
    local pick, pick_fields = fair_pick(id, t[6], t[8], depths[t[2]], service_of_type(t[2]), prefix,
      FIELDS, 8)
    if pick ~= id then
      head_id, head_fields = id, t
      id, key, t, from_head = pick, prefix .. pick, pick_fields, false
      live = tonumber(t[3]) > now
    end
  end
  if from_head then next_in_window = next_in_window + 1 end
  local ticket_type = t[2]
  if taken[id] then
    scanned = scanned + 1
  elseif t[1] ~= 'queued' or not ticket_type then
    -- Not a queued ticket any more (its hash is gone or it ended elsewhere): drop the stale entry.
    dropped[#dropped + 1] = id
    scanned = scanned + 1
  elseif not live then
    unqueue(id, KEYS[1], KEYS[2], KEYS[3], waiting[ticket_type] or KEYS[1], depths[ticket_type],
      branch_tokens[ticket_type], t[6], t[9], leaving)
    finish_ticket(key, id, ticket_type, 'expired', ARGV[1], retention,
      'TTL passed while queued', KEYS[5], KEYS[7], {counts = ended_counts})
    expired = expired + 1
    scanned = scanned + 1
  else
    -- What it may occupy in the KV cache: prompt plus the answer it may write (Ticket.cost_tokens).
    local prompt, answer = tonumber(t[4]) or 0, tonumber(t[5]) or 0
    local cost = prompt + answer
    local count_cap, token_cap = limit, budget
    if not critical[ticket_type] then
      count_cap, token_cap = normal_limit, normal_budget
    end
    if nclaimed >= count_cap then break end
    local over = budget > 0 and used + cost > token_cap
    if over and not (nclaimed == 0 and ARGV[6] == '1') then break end
    used = used + cost
    local token = next_token()
    unqueue(id, KEYS[1], KEYS[2], KEYS[3], waiting[ticket_type] or KEYS[1], depths[ticket_type],
      branch_tokens[ticket_type], t[6], t[9], leaving)
    charge_service(service_of_type(ticket_type), t[6], prompt, answer, w_in, w_out, weights)
    redis.call('HSET', key, 'status', 'running', 'token', token, 'worker', ARGV[4],
      'started_at', ARGV[1], 'lease_until', lease_until, 'attempts', (tonumber(t[7]) or 0) + 1)
    leases[nleases + 1], leases[nleases + 2], nleases = lease_until, id, nleases + 2
    nclaimed = nclaimed + 1
    claimed[nclaimed] = redis.call('HGETALL', key)
    taken[id] = true
  end
end
settle_pending()
remove_all(KEYS[2], leaving)
remove_all(KEYS[3], leaving)
add_all(KEYS[4], leases)
add_counts(KEYS[5], ended_counts)
if last_token then redis.call('SET', KEYS[6], string.format('%d', last_token)) end
for _, view in pairs(views) do write_service(view) end
return {claimed, expired}
