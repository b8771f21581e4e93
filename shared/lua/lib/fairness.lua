--[[
Token-weighted fair share between branches (the virtual token counter of "Fairness in Serving
Large Language Models", OSDI'24), included by `-- @include fairness` into the scripts that put
tickets in the pending set (enqueue, claim's promotions, preempt, reap) and into claim.

One measure on both sides: a ticket's weighted tokens, (input_weight × prompt tokens +
output_weight × max_tokens) ÷ its branch's weight (`weighted_tokens`). The claim charges them to the
branch's service; admission counts them into the branch's queued tokens and refuses a branch past
its share of the type's cap (`fair_share_verdict`).

Per type: the branch depth hash (`depth_key`) names the waiting branches and counts their queued
tickets, the branch tokens hash (QueueKeys.branch_tokens) their queued weighted tokens; each
branch's pending tickets of the type sit in the zset `depth_key .. ':' .. branch` by their queue
score (QueueKeys.branch_queue); the service zset (QueueKeys.branch_service) holds each waiting
branch's weighted tokens claimed so far, so the least served is read in O(log n). The claim takes,
within the band of the queue's head (its type and priority), the first ticket of the waiting branch
with the least service. A branch that starts waiting is lifted to the least service of those already
waiting, so time spent idle is not saved up against them. A ticket leaves its branch queue and
counts with the other queued structures (lib/tickets.lua `unqueue`).
]]

-- A ticket's weighted tokens: what the claim charges its branch's service and what admission
-- counts to its branch's queued tokens.
local function weighted_tokens(prompt, max_tokens, w_in, w_out, weight)
  return (w_in * prompt + w_out * max_tokens) / weight
end

-- One branch's tickets per weighted token (its queued tickets ÷ their weighted tokens, the inverse
-- of its mean ticket); 0 for a branch without a token count (tickets queued before it had one).
local function branch_density(held, tokens)
  if held > 0 and tokens > 0 then return held / tokens end
  return 0
end

-- The density of a type's waiting branches: their tickets per weighted token, summed. The type's
-- cap divided by it is the share (in weighted tokens) of each waiting branch: the one level at
-- which, every waiting branch holding it with tickets of its own mean size, the type holds its cap.
local function type_density(depth_key, tokens_key)
  local held = {}
  local depth = redis.call('HGETALL', depth_key)
  for i = 1, #depth, 2 do
    held[depth[i]] = tonumber(depth[i + 1])
  end
  local sum = 0
  local tokens = redis.call('HGETALL', tokens_key)
  for i = 1, #tokens, 2 do
    sum = sum + branch_density(held[tokens[i]] or 0, held_tokens(tokens[i + 1]))
  end
  return sum
end

-- Room for rounding: with equal tickets the share is a whole number of them, which must not be
-- lost to the last bit of a division.
local SHARE_SLACK = 1e-9

-- The cap and fair-share rule of enqueue.lua: "", "" to admit, else the code and words.
-- `waiting_key` holds the type's queued tickets; `held`, `branches` and `tokens` are the branch's
-- standing (lib/tickets.lua `branch_standing`), `weighted` the new ticket's weighted tokens and
-- `density` a function giving the type's density (`type_density`), called only when needed. A branch
-- with tickets queued while others wait is refused when this one would take its weighted tokens past
-- its share; with equal tickets that is the cap ÷ the waiting branches, in tickets.
local function fair_share_verdict(waiting_key, held, branches, tokens, weighted, density, cap, cap_words)
  if branches > 1 and held > 0 then
    local sum = density()
    if sum > 0 and (tokens + weighted) * sum > cap * (1 + SHARE_SLACK) then
      return 'branch_share_exceeded', ''
    end
  end
  local depth = redis.call('ZCARD', waiting_key)
  if depth >= 2 * cap or (depth >= cap and branches == 1) then
    return 'type_cap_reached', cap_words
  end
  return '', ''
end

local function branch_queue_key(depth_key, branch)
  return depth_key .. ':' .. branch
end

-- Index a pending ticket under its branch (at its queue score, so the branch keeps queue order).
local function index_pending(depth_key, branch, id, score)
  if depth_key and branch then
    redis.call('ZADD', branch_queue_key(depth_key, branch), score, id)
  end
end

-- Index tickets `promote_due` moved back to the pending set (`depths`: type -> depth key).
local function index_promoted(ids, prefix, depths)
  for _, id in ipairs(ids) do
    local t = redis.call('HMGET', prefix .. id, 'type', 'branch_id', 'score')
    if t[1] then index_pending(depths[t[1]], t[2], id, t[3]) end
  end
end

-- Lift `branch`'s service (`own`, nil when not counted) to `least`, the least service of the
-- branches waiting; never lower it (a branch not counted yet starts there).
local function lift_to(service_key, branch, own, least)
  if not own or tonumber(own) < tonumber(least) then
    redis.call('ZADD', service_key, least, branch)
  end
end

-- A branch about to wait for a type (none of its tickets is queued): lift its service to the
-- least service of the branches waiting.
local function lift_service(service_key, branch)
  local least = redis.call('ZRANGE', service_key, 0, 0, 'WITHSCORES')[2]
  if least then lift_to(service_key, branch, redis.call('ZSCORE', service_key, branch), least) end
end

-- The branch's first ticket still queued, with its `fields` (a list starting with 'status') read in
-- the same call; nil when none. Entries whose ticket is no longer queued leave the branch's queue.
local function first_pending(depth_key, branch, prefix, fields)
  local queue_key = branch_queue_key(depth_key, branch)
  for _ = 1, 100 do
    local head = redis.call('ZRANGE', queue_key, 0, 0)[1]
    if not head then return nil end
    local t = redis.call('HMGET', prefix .. head, unpack(fields))
    if t[1] == 'queued' then return head, t end
    redis.call('ZREM', queue_key, head)
  end
  return nil
end

local PICK_SCAN = 4
-- Which ticket the claim takes instead of the head `id` (its branch and priority given): the
-- first queued ticket of equal priority of the waiting branch with the least service; the head
-- itself when its branch is served least (the caller skips this while one branch waits). Branches
-- are read from the least served up, at most PICK_SCAN of them, in one read that also gives the
-- head branch's own service when it is among them; one no longer waiting leaves the service set on
-- the way (its service is forgotten: it was at most the least, which a branch that waits again
-- gets). Returns the id and, for another ticket, its `fields` (`priority_at` indexes its priority).
local function fair_pick(id, branch, priority, depth_key, service_key, prefix, fields, priority_at)
  if not depth_key or not service_key or not branch then return id end
  local lowest = redis.call('ZRANGE', service_key, 0, PICK_SCAN - 1, 'WITHSCORES')
  if not lowest[1] or lowest[1] == branch then return id end
  local own
  for i = 3, #lowest, 2 do
    if lowest[i] == branch then own = tonumber(lowest[i + 1]) end
  end
  if not own then
    own = redis.call('ZSCORE', service_key, branch)
    if not own then
      lift_to(service_key, branch, nil, lowest[2])
      return id  -- lifted to the least: a tie, which the head wins
    end
    own = tonumber(own)
  end
  if tonumber(lowest[2]) >= own then return id end
  for i = 1, #lowest, 2 do
    local other, served = lowest[i], tonumber(lowest[i + 1])
    if served >= own or other == branch then return id end
    local other_id, t = first_pending(depth_key, other, prefix, fields)
    if other_id then
      if t[priority_at] == priority then return other_id, t end
    elseif redis.call('HEXISTS', depth_key, other) == 0 then
      redis.call('ZREM', service_key, other)
    end
  end
  return id
end

-- Weights from the claim's or the enqueue's ARGV starting at `at`: input, output, then m
-- branch/weight pairs. Returns them and the index after them.
local function fairness_weights(at)
  local weights = {}
  local m = tonumber(ARGV[at + 2])
  for i = 0, m - 1 do
    weights[ARGV[at + 3 + 2 * i]] = tonumber(ARGV[at + 4 + 2 * i])
  end
  return tonumber(ARGV[at]), tonumber(ARGV[at + 1]), weights, at + 3 + 2 * m
end

-- Count a claimed ticket's weighted tokens to its branch's service.
local function charge_service(service_key, branch, prompt, max_tokens, w_in, w_out, weights)
  if service_key and branch then
    local cost = weighted_tokens(prompt, max_tokens, w_in, w_out, weights[branch] or 1)
    redis.call('ZINCRBY', service_key, cost, branch)
  end
end
