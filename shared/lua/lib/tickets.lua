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

-- End a ticket: stamp the terminal status, start its retention clock, count the outcome and hand
-- its callback (if any) to the outbox, all in the caller's atomic step.
local function finish_ticket(ticket_key, id, ticket_type, status, now, retention, error_text,
                             counts_key, outbox_key)
  redis.call('HSET', ticket_key, 'status', status, 'finished_at', now, 'token', '')
  if error_text ~= nil and error_text ~= '' then
    redis.call('HSET', ticket_key, 'error', error_text)
  end
  redis.call('EXPIRE', ticket_key, retention)
  redis.call('HINCRBY', counts_key, ticket_type .. ':' .. status, 1)
  if redis.call('HEXISTS', ticket_key, 'callback_url') == 1 then
    redis.call('LPUSH', outbox_key, id)
  end
end

-- Map type name -> waiting key from parallel KEYS / ARGV tails.
local function waiting_keys(first_key_index, first_argv_index, count)
  local map = {}
  for i = 0, count - 1 do
    map[ARGV[first_argv_index + i]] = KEYS[first_key_index + i]
  end
  return map
end
