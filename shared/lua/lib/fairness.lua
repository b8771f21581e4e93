--[[
Token-weighted fair share between branches (the virtual token counter of "Fairness in Serving
Large Language Models", OSDI'24), included by `-- @include fairness` into enqueue and claim.

Per type: the branch depth hash (`depth_key`) names the waiting branches; each branch's pending
tickets of the type sit in the zset `depth_key .. ':' .. branch` by their queue score
(QueueKeys.branch_queue); the service hash (QueueKeys.branch_service) holds each branch's weighted
tokens claimed so far. The claim takes, within the band of the queue's head (its type and
priority), the first ticket of the waiting branch with the least service. A branch that starts
waiting is lifted to the least service of those already waiting, so time spent idle is not saved
up against them. Stale index entries (cancelled, expired tickets) are dropped when met.
]]

local function branch_queue_key(depth_key, branch)
  return depth_key .. ':' .. branch
end

-- Index a pending ticket under its branch (at its queue score, so the branch keeps queue order).
local function index_pending(depth_key, branch, id, score)
  if depth_key and branch then
    redis.call('ZADD', branch_queue_key(depth_key, branch), score, id)
  end
end

local function unindex_pending(depth_key, branch, id)
  if depth_key and branch then
    redis.call('ZREM', branch_queue_key(depth_key, branch), id)
  end
end

-- A branch about to wait for a type (none of its tickets is queued): lift its service to the
-- least service of the branches already waiting, never lower it.
local function lift_service(service_key, depth_key, branch)
  local least = nil
  for _, other in ipairs(redis.call('HKEYS', depth_key)) do
    if other ~= branch then
      local served = tonumber(redis.call('HGET', service_key, other) or '0')
      if least == nil or served < least then least = served end
    end
  end
  if least ~= nil and tonumber(redis.call('HGET', service_key, branch) or '0') < least then
    redis.call('HSET', service_key, branch, string.format('%.17g', least))
  end
end

-- The branch's first ticket still in the pending set, and its score (nil when none).
local function first_pending(depth_key, branch, pending_key)
  local queue_key = branch_queue_key(depth_key, branch)
  for _ = 1, 100 do
    local head = redis.call('ZRANGE', queue_key, 0, 0, 'WITHSCORES')
    if not head[1] then return nil end
    if redis.call('ZSCORE', pending_key, head[1]) then return head[1], tonumber(head[2]) end
    redis.call('ZREM', queue_key, head[1])
  end
  return nil
end

-- Which ticket the claim takes instead of the head `id` (its branch, priority and score given):
-- the first pending ticket of equal priority of the waiting branch with the least service (ties
-- in queue order); the head itself when its branch waits alone or is served least.
local function fair_pick(id, branch, priority, score, depth_key, service_key, pending_key, prefix)
  if not depth_key or not service_key or not branch or redis.call('HLEN', depth_key) < 2 then
    return id
  end
  index_pending(depth_key, branch, id, score)  -- a ticket back from a lost lease or a preemption
  local best, best_served, best_score = id, tonumber(redis.call('HGET', service_key, branch) or '0'),
    tonumber(score)
  for _, other in ipairs(redis.call('HKEYS', depth_key)) do
    if other ~= branch then
      local served = tonumber(redis.call('HGET', service_key, other) or '0')
      if served <= best_served then
        local other_id, other_score = first_pending(depth_key, other, pending_key)
        if other_id and (served < best_served or other_score < best_score)
            and redis.call('HGET', prefix .. other_id, 'priority') == priority then
          best, best_served, best_score = other_id, served, other_score
        end
      end
    end
  end
  return best
end

-- Weights from the claim's ARGV starting at `at`: input, output, then m branch/weight pairs.
-- Returns them and the index after them.
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
    local cost = (w_in * prompt + w_out * max_tokens) / (weights[branch] or 1)
    redis.call('HINCRBYFLOAT', service_key, branch, cost)
  end
end
