--[[
Submit a batch of tickets in one step: each is either queued (ticket hash, priority entry, TTL
index, per-type index) or recorded `rejected` — because admission shed it (its shed code), its
type's queue cap is full, or its branch holds its fair share of the type while other branches wait.
The rejected record is lean (no prompt, no words: readers look them up from the code) and shares a
bucket hash with the records of its time (lib/rejected.lua), living its own retention; a retry under
the same idempotency key reuses the record an earlier shed try left instead of writing another.

The batch is checked before anything is written: a ticket with a bad value fails the whole call
with an error naming the ticket (its place from 1 and its id) and the field, and nothing of the
batch is stored. Past the check each ticket stands on its own (queued, existing or rejected), in
batch order, so a later ticket sees the earlier ones (its fair share, its turn, its idempotency key).

KEYS[1] pending zset            {q}:pending
KEYS[2] deadlines zset          {q}:deadlines
KEYS[3] counts hash             {q}:counts   ("<type>:submitted", ":rejected", ":shed:<code>")
KEYS[4] wake list               {q}:wake
KEYS[5] delayed zset            {q}:delayed
KEYS[6] ticket hash prefix      {q}:t:      (ids are the caller's; the prefix carries the queue's
                                             hash tag, so every key stays on one slot; + "~" and
                                             an id's first 7 characters: a bucket of rejected
                                             records)
KEYS[7] idempotency prefix      {q}:idem:   (+ "<branch>:<key>"; + "~<window>": the index of
                                             rejected submissions' keys)
KEYS[8] shed counts of the minute {q}:sheds:<minute>  ("<type>:<code>" → count; lives ARGV[3])
KEYS[9..8+n] waiting zset of each type, in the order of the type names below
KEYS[9+n..8+2n] branch depth hash of each type, same order
KEYS[9+2n] monitor state hash   {q}:monitor  (its service rate, for the deadline rule)
KEYS[10+2n..9+3n] branch service zset of each type, same order as the waiting zsets (lib/fairness.lua)
KEYS[10+3n..9+4n] branch tokens hash of each type, same order (branch → its queued weighted tokens)

ARGV[1] created_at of every ticket of the batch (Unix seconds)
ARGV[2] seconds an accepted ticket's idempotency key lives (its longest retention)
ARGV[3] seconds a rejected record (and its idempotency key) lives
ARGV[4] most wake-up markers the wake list holds
ARGV[5] n, the number of types; then n type names, n caps (most queued tickets of the type), n
        words for the cap's code (used when the cap refuses a ticket), n SLOs (seconds), n critical
        flags ("1": never refused by the deadline rule) and n lists of the types served ahead
        (comma-separated: their arrivals are taken off the service rate)
then the fairness weights (shared/policy.py `FairnessPolicy.cost_args`): a prompt token's, an answer
        token's, m, and m pairs branch, weight (branches not named weigh 1)
then, per ticket, 17 values and its hash fields:
        id, type, branch, priority, sorted-set score (shared/scoring.py), expires_at, idempotency
        key ("" for none), ready_at (later than created_at: deferred, parked in the delayed set),
        shed code admission decided ("" when admitted), words for that code, Retry-After seconds,
        deadline, prompt tokens (estimated) and max_tokens (for its weighted tokens), red line
        ("" for none), l and f; then f field, value pairs to store, of which the first l are the
        lean record's

Fair share, counted in weighted tokens (lib/fairness.lua): an admitted ticket stores its
`weighted_tokens`, (input_weight × prompt_tokens_estimate + output_weight × max_tokens) ÷ its
branch's weight (what the claim charges), counted to its branch in the type's branch tokens hash
beside its ticket count. While other branches have queued tickets of the type, a branch with some
queued too is refused (code branch_share_exceeded, words left to the caller) when this ticket would
take its weighted tokens past its share

    S = cap ÷ Σ (queued tickets ÷ queued weighted tokens), summed over the waiting branches,

the level at which, every waiting branch holding S in tickets of its own mean size, the type holds
its cap of tickets. A branch of weight w holds w × S tokens; a branch whose tickets weigh ten times
more holds a tenth of the tickets; with equal tickets S is cap ÷ (waiting branches) tickets. A
branch below its share is admitted even past the cap, up to twice the cap (in tickets), so one
branch's flood cannot lock the others out of a type. Turns: while several branches wait, a new
ticket is scored just behind the type's equal-priority ticket at its round-robin place
(lib/tickets.lua `turn_score`), so branches of equal priority are served in turn instead of a flood
first. A queued ticket is also indexed under its branch, and a branch that starts waiting has its
service lifted (lib/fairness.lua), for the claim's token-weighted choice between branches.

Deadlines (lib/deadline.lua): a ticket's values carry its deadline, the call's header each type's
SLO, whether it is critical (never refused by this rule) and the types served before it. A retry under
the idempotency key of a shed try keeps that try's `first_seen_at`, so the SLO counts from the first
submission. A ticket that would pass every other rule but cannot start before its deadline is
recorded rejected with code deadline_unreachable and a Retry-After from the estimate.

The red line: a ticket's values may carry a red line (admission draws it while the queue is busy,
below the policy's red threshold: producer/admission.py). A ticket that is not critical, passing every rule before it, is
refused with queue_red when the queue already holds that many tickets (ready plus delayed), counted
on through the batch: the queue holds below red ticket by ticket instead of overshooting it between
the monitor's samples and cycling red and orange.

Returns one flat list, four values per ticket in batch order: "queued", id, "", "" |
"existing", id of the earlier ticket, "", "" | "rejected", id, code, words (for
deadline_unreachable and the red line's queue_red: the Retry-After seconds, the words being left to
the caller).
]]
-- @include tickets
-- @include rejected
-- @include deadline
-- @include fairness

local created = ARGV[1]
local now = tonumber(created)
local ntypes = tonumber(ARGV[5])
local waiting = waiting_keys(9, 6, ntypes)
local depths = waiting_keys(9 + ntypes, 6, ntypes)
local monitor_key = KEYS[9 + 2 * ntypes]
local services = waiting_keys(10 + 2 * ntypes, 6, ntypes)
local branch_tokens = waiting_keys(10 + 3 * ntypes, 6, ntypes)
local caps, cap_words, slos, critical_types, ahead_of = {}, {}, {}, {}, {}
for i = 0, ntypes - 1 do
  local name = ARGV[6 + i]
  caps[name] = tonumber(ARGV[6 + ntypes + i])
  cap_words[name] = ARGV[6 + 2 * ntypes + i]
  slos[name] = tonumber(ARGV[6 + 3 * ntypes + i])
  critical_types[name] = ARGV[6 + 4 * ntypes + i] == '1'
  ahead_of[name] = ARGV[6 + 5 * ntypes + i]
end
local w_in, w_out, weights, first_ticket = fairness_weights(6 + 6 * ntypes)
-- Tickets queued now, read at the red line's first use in this call and counted on from there.
local depth = nil
local function queued_depth()
  if not depth then depth = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[5]) end
  return depth
end
-- A figure per type, read at its first use in this call (`read(ticket_type)`, nil kept as false)
-- and then taken from `known`, which the script keeps up to date as it queues tickets (nothing else
-- changes them while it runs).
local function per_type(read)
  local known = {}
  local function get(ticket_type)
    local value = known[ticket_type]
    if value == nil then
      value = read(ticket_type)
      if value == nil then value = false end
      known[ticket_type] = value
    end
    return value or nil
  end
  return get, known
end
-- The type's queued tickets (its waiting zset's size) and waiting branches (its branch depth hash's
-- size); the monitor's figures its deadline rule reads (lib/deadline.lua `drain_figures`); its
-- density (lib/fairness.lua `type_density`), which the fair-share rule reads only when it needs it.
local type_depth, type_depths = per_type(function(t) return redis.call('ZCARD', waiting[t]) end)
local branch_count, type_branches = per_type(function(t) return redis.call('HLEN', depths[t]) end)
local drain_of = per_type(function(t) return drain_figures(monitor_key, ahead_of[t], now) end)
local density, densities = per_type(function(t) return type_density(depths[t], branch_tokens[t]) end)
local function density_of(ticket_type)
  return function() return density(ticket_type) end
end

-- Check every ticket before writing any, so a refused batch leaves nothing behind.
local function bad(i, id, field, value, wanted)
  return redis.error_reply('ticket ' .. i .. ' (' .. id .. '): ' .. field .. ' ' .. string.format('%q', value) ..
    ' is not accepted; expected ' .. wanted)
end
local numbers = {{4, 'score'}, {5, 'expires_at'}, {7, 'ready_at'}, {10, 'retry_after'}, {11, 'deadline'}}
local starts = {}
local at = first_ticket
while at <= #ARGV do
  local i = #starts + 1
  local id = ARGV[at]
  local lean, fields = tonumber(ARGV[at + 15]), tonumber(ARGV[at + 16])
  if not lean or not fields or lean > fields or at + 16 + 2 * fields > #ARGV then
    return bad(i, id or '', 'fields', (ARGV[at + 15] or '') .. ' ' .. (ARGV[at + 16] or ''),
      'the counts of lean and of all field pairs that follow')
  end
  if id == '' then return bad(i, id, 'id', id, 'a ticket id') end
  if not waiting[ARGV[at + 1]] then return bad(i, id, 'type', ARGV[at + 1], 'one of the types') end
  if ARGV[at + 2] == '' then return bad(i, id, 'branch_id', '', 'a branch') end
  for n = 1, #numbers do
    local f = numbers[n]
    if not tonumber(ARGV[at + f[1]]) then return bad(i, id, f[2], ARGV[at + f[1]], 'a number') end
  end
  starts[i] = at
  at = at + 17 + 2 * fields
end

local submitted, rejected, shed = {}, {}, {}
local function bump(map, name)
  map[name] = (map[name] or 0) + 1
end
local out = {}
local function emit(outcome, id, code, words)
  local n = #out
  out[n + 1], out[n + 2], out[n + 3], out[n + 4] = outcome, id, code, words
end
local queued = 0
-- The deadlines set's new entries (expires_at, id), added in one go at the end: nothing here reads it.
local expiries = {}
for i = 1, #starts do
  local at = starts[i]
  local id, ticket_type, branch, priority = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3]
  local score, idem = ARGV[at + 4], ARGV[at + 6]
  local fields_at = at + 17
  local lean_end = fields_at + 2 * tonumber(ARGV[at + 15]) - 1
  local fields_end = fields_at + 2 * tonumber(ARGV[at + 16]) - 1
  local ticket_key = KEYS[6] .. id
  local idem_key = idem ~= '' and (KEYS[7] .. branch .. ':' .. idem) or nil
  local done = false
  local first_seen = now
  if idem_key then
    local existing = redis.call('GET', idem_key)
    if existing then
      if redis.call('HGET', KEYS[6] .. existing, 'status') ~= 'rejected' then
        -- The key expires with the ticket's retention, so it never outlives the ticket it names.
        emit('existing', existing, '', '')
        done = true
      else
        -- An earlier try of this submission was shed: this one takes over its id and record.
        id = existing
        ticket_key = KEYS[6] .. existing
        first_seen = math.min(first_seen, first_sighting(ticket_key) or first_seen)
        redis.call('DEL', ticket_key)
      end
    else
      local shed_before = find_rejected_key(KEYS[7], KEYS[6], created, ARGV[3], branch .. ':' .. idem)
      if shed_before then  -- an earlier try was shed: take over its id (its record is rewritten)
        id = shed_before
        ticket_key = KEYS[6] .. id
        first_seen = math.min(first_seen, rejected_first_sighting(KEYS[6], id) or first_seen)
        forget_rejected(KEYS[6], id)
      end
    end
  end
  if not done then
    bump(submitted, ticket_type)
    local code, words, retry_after = ARGV[at + 8], ARGV[at + 9], ARGV[at + 10]
    local held, branches, tokens, weighted = 0, 1, 0, nil
    if code == '' then
      held, tokens = branch_standing(depths[ticket_type], branch_tokens[ticket_type], branch)
      branches = branch_count(ticket_type)
      if held == 0 then branches = branches + 1 end
      local prompt = tonumber(ARGV[at + 12]) or 0
      local answer = tonumber(ARGV[at + 13]) or 0
      weighted = weighted_tokens(prompt, answer, w_in, w_out, weights[branch] or 1)
      weighted = token_units(weighted) / TOKEN_UNITS  -- the measure the branch tokens hash keeps
      code, words = fair_share_verdict(type_depth(ticket_type), held, branches, tokens, weighted,
        density_of(ticket_type), caps[ticket_type], cap_words[ticket_type])
    end
    local critical = critical_types[ticket_type]
    local red_line = tonumber(ARGV[at + 14]) or 0
    if code == '' and red_line > 0 and not critical and queued_depth() >= red_line then
      -- Red's refusal, decided per ticket: the queue never holds more than the red line of work
      -- that is not critical, so the level (the monitor's smoothed depth) holds below red.
      if (tonumber(retry_after) or 0) <= 0 then retry_after = '1' end  -- a caller without admission's
      code, words = 'queue_red', retry_after
    end
    -- A retry's first sighting as stored (nil for a first try, whose first sighting is `created`).
    local retry_seen = first_seen < now and string.format('%.17g', first_seen) or nil
    local slo = slos[ticket_type]
    local deadline, deadline_text = tonumber(ARGV[at + 11]), ARGV[at + 11]
    if first_seen + slo < deadline then  -- a retry: the SLO counts from the first try
      deadline = first_seen + slo
      deadline_text = string.format('%.17g', deadline)
    end
    if code == '' and not critical then
      local late = deadline_refusal(KEYS[1], drain_of(ticket_type), score, now, deadline, slo)
      if late then
        retry_after = string.format('%.1f', late)
        code, words = 'deadline_unreachable', retry_after
      end
    end
    if code ~= '' then
      -- lean: only a retry's record needs its first sighting
      record_rejected(KEYS[6], id, code, retry_after, fields_at, lean_end, retry_seen or '', ARGV[3])
      if idem_key then remember_rejected_key(KEYS[7], created, ARGV[3], branch .. ':' .. idem, id) end
      bump(rejected, ticket_type)
      bump(shed, ticket_type .. ':' .. code)
      emit('rejected', id, code, words)
    else
      local deferred = tonumber(ARGV[at + 7]) > now
      if not deferred then
        score = turn_score(waiting[ticket_type], KEYS[1], KEYS[6], held, branches, priority, score)
      end
      local weighted_text = string.format('%.17g', weighted)
      local hash = {'id', id, 'status', 'queued', 'score', score, 'first_seen_at', retry_seen or created,
        'weighted_tokens', weighted_text, 'deadline', deadline_text}
      for j = fields_at, fields_end do hash[j - fields_at + 13] = ARGV[j] end
      redis.call('HSET', ticket_key, unpack(hash))
      if deferred then
        redis.call('ZADD', KEYS[5], ARGV[at + 7], id)
      else
        redis.call('ZADD', KEYS[1], score, id)
        index_pending(depths[ticket_type], branch, id, score)
      end
      if held == 0 then
        lift_service(services[ticket_type], branch)
        type_branches[ticket_type] = branches
      end
      type_depths[ticket_type] = type_depth(ticket_type) + 1
      expiries[#expiries + 1], expiries[#expiries + 2] = ARGV[at + 5], id
      redis.call('ZADD', waiting[ticket_type], created, id)
      count_branch(depths[ticket_type], branch_tokens[ticket_type], branch, 1, weighted_text)
      if densities[ticket_type] then
        densities[ticket_type] = densities[ticket_type] - branch_density(held, tokens) +
          branch_density(held + 1, tokens + weighted)
      end
      if idem_key then redis.call('SET', idem_key, id, 'EX', ARGV[2]) end
      queued = queued + 1
      if depth then depth = depth + 1 end
      emit('queued', id, '', '')
    end
  end
end

for name, n in pairs(submitted) do redis.call('HINCRBY', KEYS[3], name .. ':submitted', n) end
for name, n in pairs(rejected) do redis.call('HINCRBY', KEYS[3], name .. ':rejected', n) end
if next(shed) then
  for name, n in pairs(shed) do
    redis.call('HINCRBY', KEYS[8], name, n)
    -- For good too, per type and code (shared/class_counts.py): "<type>:shed:<code>".
    local ticket_type, code = string.match(name, '^(.*):([^:]*)$')
    redis.call('HINCRBY', KEYS[3], ticket_type .. ':shed:' .. code, n)
  end
  redis.call('EXPIRE', KEYS[8], ARGV[3])
end
if queued > 0 then
  add_all(KEYS[2], expiries)
  wake_workers(KEYS[4], queued, tonumber(ARGV[4]))
end
return out
