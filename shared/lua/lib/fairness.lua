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
-- `depth` is the type's queued tickets; `held` and `tokens` are the branch's standing
-- (lib/tickets.lua `branch_standing`), `branches` the waiting branches with it counted, `weighted` the new ticket's weighted tokens and
-- `density` a function giving the type's density (`type_density`), called only when needed. A branch
-- with tickets queued while others wait is refused when this one would take its weighted tokens past
-- its share; with equal tickets that is the cap ÷ the waiting branches, in tickets.
local function fair_share_verdict(depth, held, branches, tokens, weighted, density, cap, cap_words)
  if branches > 1 and held > 0 then
    local sum = density()
    if sum > 0 and (tokens + weighted) * sum > cap * (1 + SHARE_SLACK) then
      return 'branch_share_exceeded', ''
    end
  end
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

-- The service a branch that starts waiting takes: `least`, the least service of the branches
-- waiting, unless its own (nil when not counted) is more already: a lift never lowers it.
local function lifted(own, least)
  if not own or own < least then return least end
  return own
end

-- A branch about to wait for a type (none of its tickets is queued): lift its service to the
-- least service of the branches waiting.
local function lift_service(service_key, branch)
  local least = redis.call('ZRANGE', service_key, 0, 0, 'WITHSCORES')[2]
  if not least then return end
  local own = tonumber(redis.call('ZSCORE', service_key, branch) or '')
  if lifted(own, tonumber(least)) ~= own then redis.call('ZADD', service_key, least, branch) end
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

-- A type's branch service zset as one claim holds it: each branch's service as read (once) or as
-- this claim changed it (`score`: false for a branch not in the set), the branches to write at the
-- claim's end (`changed`, by `write_service`: one ZADD and one ZREM instead of a ZINCRBY a ticket),
-- and the set's least service with how many branches have it (`least`, `at_least`; nil when not
-- known, read again from the set when needed). `whole`: the set was read empty, so every branch
-- in it is one this claim put there.
local function service_view(service_key)
  return {key = service_key, score = {}, changed = {}, least = nil, at_least = 0, whole = false}
end

-- Write the view's changes: one ZADD of the changed services, one ZREM of the forgotten branches.
local function write_service(view)
  local adds, gone, n = {}, {}, 0
  for branch in pairs(view.changed) do
    local served = view.score[branch]
    if served then
      adds[n + 1], adds[n + 2], n = served, branch, n + 2
    else
      gone[#gone + 1] = branch
    end
  end
  if n > 0 then redis.call('ZADD', view.key, unpack(adds)) end
  if #gone > 0 then redis.call('ZREM', view.key, unpack(gone)) end
  view.changed = {}
end

-- Read the set's least service and how many branches have it (the view's changes written first).
local function read_least(view)
  write_service(view)
  local lowest = redis.call('ZRANGE', view.key, 0, 0, 'WITHSCORES')
  if lowest[1] then
    view.least, view.whole = tonumber(lowest[2]), false
    view.at_least = redis.call('ZCOUNT', view.key, lowest[2], lowest[2])
    view.score[lowest[1]] = view.least
  else
    view.least, view.whole = nil, true
  end
end

-- `branch`'s service: the view's, else the set's (read once); nil when it is not in the set.
local function service_of(view, branch)
  local served = view.score[branch]
  if served == nil then
    served = false
    if not view.whole then served = tonumber(redis.call('ZSCORE', view.key, branch) or '') or false end
    view.score[branch] = served
  end
  return served or nil
end

-- Set `branch`'s service (known to the view, as `service_of` leaves it) to `served`, or take the
-- branch out of the set (nil), keeping the least service and its count while they are known.
local function set_service(view, branch, served)
  local was = view.score[branch]
  if was and was == view.least then view.at_least = view.at_least - 1 end
  view.score[branch], view.changed[branch] = served or false, true
  if served and (view.least or view.whole) then
    if not view.least or served < view.least then
      view.least, view.at_least = served, 1
    elseif served == view.least then
      view.at_least = view.at_least + 1
    end
  end
  if view.least and view.at_least == 0 then view.least, view.whole = nil, false end
end

-- Which ticket the claim takes instead of the head `id` (its branch and priority given): the
-- first queued ticket of equal priority of the waiting branch with the least service; the head
-- itself when its branch is served least (the caller skips this while one branch waits). `view` is
-- the type's service (`service_view`): a head branch with the least service, or not in the set
-- (lifted to the least), keeps the head without reading more. Else the branches are read from the
-- least served up, at most PICK_SCAN of them; one no longer waiting leaves the service set on the
-- way (its service is forgotten: it was at most the least, which a branch that waits again gets).
-- Returns the id and, for another ticket, its `fields` (`priority_at` indexes its priority).
local function fair_pick(id, branch, priority, depth_key, view, prefix, fields, priority_at)
  if not depth_key or not view or not branch then return id end
  if not view.least and not view.whole then read_least(view) end
  if not view.least then return id end  -- nobody served yet
  local own = service_of(view, branch)
  if not own then
    set_service(view, branch, lifted(own, view.least))
    return id  -- lifted to the least: a tie, which the head wins
  end
  if own <= view.least then return id end
  write_service(view)
  local lowest = redis.call('ZRANGE', view.key, 0, PICK_SCAN - 1, 'WITHSCORES')
  for i = 1, #lowest, 2 do
    local other, served = lowest[i], tonumber(lowest[i + 1])
    if served >= own or other == branch then return id end
    local other_id, t = first_pending(depth_key, other, prefix, fields)
    if other_id then
      if t[priority_at] == priority then return other_id, t end
    elseif redis.call('HEXISTS', depth_key, other) == 0 then
      view.score[other] = served
      set_service(view, other, nil)
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

-- Count a claimed ticket's weighted tokens to its branch's service (`view`: the type's).
local function charge_service(view, branch, prompt, max_tokens, w_in, w_out, weights)
  if view and branch then
    local cost = weighted_tokens(prompt, max_tokens, w_in, w_out, weights[branch] or 1)
    set_service(view, branch, (service_of(view, branch) or 0) + cost)
  end
end
