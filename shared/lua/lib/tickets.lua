--[[
Helpers included (by `-- @include tickets`) into the scripts that move tickets between states.
They take keys as arguments from the including script's KEYS; they build no keys themselves.
]]

-- Remove a ticket from every structure that holds queued tickets.
local function unqueue(id, pending_key, delayed_key, deadlines_key, waiting_key)
  redis.call('ZREM', pending_key, id)
  redis.call('ZREM', delayed_key, id)
  redis.call('ZREM', deadlines_key, id)
  redis.call('ZREM', waiting_key, id)
end

-- The retention spec every ending script gets from Python (shared/policy.py `retention_spec`):
-- "<done> <failed> <expired> <cancelled> <keep prompts 1|0>", seconds per outcome.
local function retention_for(spec, status)
  local done, failed, expired, cancelled, keep =
    string.match(spec, '^(%d+) (%d+) (%d+) (%d+) ([01])$')
  local seconds = ({done = done, failed = failed, expired = expired, cancelled = cancelled})[status]
  return seconds, keep == '1'
end

-- End a ticket: stamp the terminal status, start its outcome's retention clock (dropping the
-- prompt when the policy keeps none), count the outcome and hand its callback (if any) to the
-- outbox, all in the caller's atomic step.
local function finish_ticket(ticket_key, id, ticket_type, status, now, retention, error_text,
                             counts_key, outbox_key)
  redis.call('HSET', ticket_key, 'status', status, 'finished_at', now, 'token', '')
  if error_text ~= nil and error_text ~= '' then
    redis.call('HSET', ticket_key, 'error', error_text)
  end
  local seconds, keep_prompt = retention_for(retention, status)
  if not keep_prompt then
    redis.call('HDEL', ticket_key, 'prompt', 'messages')
  end
  redis.call('EXPIRE', ticket_key, seconds)
  redis.call('HINCRBY', counts_key, ticket_type .. ':' .. status, 1)
  if redis.call('HEXISTS', ticket_key, 'callback_url') == 1 then
    redis.call('LPUSH', outbox_key, id)
  end
end

-- Move retries whose backoff is over from the delayed set back to the pending set at their score.
-- `prefix` is the ticket-hash prefix the caller got in its KEYS. Returns how many moved.
local function promote_due(delayed_key, pending_key, prefix, now, limit)
  local promoted = 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed_key, '-inf', now, 'LIMIT', 0, limit)) do
    redis.call('ZREM', delayed_key, id)
    local score = redis.call('HGET', prefix .. id, 'score')
    if score then
      redis.call('ZADD', pending_key, score, id)
      promoted = promoted + 1
    end
  end
  return promoted
end

-- Leave `count` wake-up markers for idle workers, keeping at most `cap` in the list.
local function wake_workers(wake_key, count, cap)
  for _ = 1, math.min(count, cap) do
    redis.call('LPUSH', wake_key, '1')
  end
  redis.call('LTRIM', wake_key, 0, cap - 1)
end

-- Map type name -> waiting key from parallel KEYS / ARGV tails.
local function waiting_keys(first_key_index, first_argv_index, count)
  local map = {}
  for i = 0, count - 1 do
    map[ARGV[first_argv_index + i]] = KEYS[first_key_index + i]
  end
  return map
end
