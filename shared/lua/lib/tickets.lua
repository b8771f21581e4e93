--[[
Helpers included (by `-- @include tickets`) into the scripts that move tickets between states.
They take keys as arguments from the including script's KEYS; they build no keys themselves.
]]

-- The branch tokens hash counts thousandths of a weighted token, as integers: HINCRBY costs the
-- server much less than HINCRBYFLOAT, which a script must also replicate as a rewritten HSET.
local TOKEN_UNITS = 1000

-- A ticket's `weighted_tokens` field in the branch tokens hash's units; nil when it has none.
local function token_units(weighted)
  local tokens = tonumber(weighted or '')
  if tokens then return math.floor(tokens * TOKEN_UNITS + 0.5) end
  return nil
end

-- A field name longer than Redis's default `hash-max-listpack-value`: written to a branch hash and
-- deleted at once when the hash is made, it turns the hash into a hash table, which Redis never turns
-- back into a listpack. A type's branch hashes hold a field per waiting branch, hundreds of them: in
-- a listpack each lookup scans them all, in a hash table it is one probe.
local HASH_TABLE_FIELD = string.rep('~', 128)
local function as_hash_table(key)
  redis.call('HSET', key, HASH_TABLE_FIELD, '')
  redis.call('HDEL', key, HASH_TABLE_FIELD)
end

-- Count one more (delta 1) or one fewer (-1) queued ticket of `branch` of a type: the branch depth
-- hash counts its tickets, the branch tokens hash (`tokens_key`) their weighted tokens (`weighted`:
-- the ticket's `weighted_tokens` field, written once at admission, so a ticket takes out exactly
-- what it brought in, whatever the policy says meanwhile). A branch with none left leaves both
-- hashes: the depth hash's length counts the waiting branches, and no rounding of the token sum
-- outlives the tickets it counted.
local function count_branch(depth_key, tokens_key, branch, delta, weighted)
  if not depth_key or not branch then return end
  local held = redis.call('HINCRBY', depth_key, branch, delta)
  if held <= 0 then
    redis.call('HDEL', depth_key, branch)
    if tokens_key then redis.call('HDEL', tokens_key, branch) end
    return
  end
  if tokens_key then
    local units = token_units(weighted)
    if units then redis.call('HINCRBY', tokens_key, branch, delta * units) end
  end
  if held == delta and redis.call('HLEN', depth_key) == 1 then
    -- The hashes were just made (this branch is their only one).
    as_hash_table(depth_key)
    if tokens_key then as_hash_table(tokens_key) end
  end
end

-- A branch's weighted tokens as the branch tokens hash holds them (a field's value, or nil).
local function held_tokens(value)
  return (tonumber(value or '0') or 0) / TOKEN_UNITS
end

-- Where `branch` stands among a type's waiting branches (`depth_key`, `tokens_key`): its queued
-- tickets of the type and their weighted tokens. Read once per new ticket and used by the rules of
-- enqueue.lua (which counts the waiting branches once per call).
local function branch_standing(depth_key, tokens_key, branch)
  local held = tonumber(redis.call('HGET', depth_key, branch) or '0')
  local tokens = held_tokens(redis.call('HGET', tokens_key, branch))
  return held, tokens
end

-- The score of a new ticket that takes its turn: with k branches waiting, the branch's j-th
-- queued ticket goes just behind the type's (j·(k−1))-th oldest one, if that one has the same
-- priority and a lower score; else the ticket keeps `score`. Against every other ticket it then
-- takes the order of the one it follows: one turn ahead of a flood, not a jump over other priorities.
local function turn_score(waiting_key, pending_key, prefix, held, branches, priority, score)
  if branches < 2 then return score end
  local rank = (held + 1) * (branches - 1) - 1
  local at = redis.call('ZRANGE', waiting_key, rank, rank)[1]
  if not at or redis.call('HGET', prefix .. at, 'priority') ~= priority then return score end
  local behind = tonumber(redis.call('ZSCORE', pending_key, at) or '')
  if behind and behind < tonumber(score) then
    return string.format('%.17g', behind + math.max(math.abs(behind) * 1e-12, 1e-6))
  end
  return score
end

-- Remove a ticket from every structure that holds queued tickets (and from its branch's counts
-- and queue under its type's `depth_key` and `tokens_key`, when the caller gives them with the
-- ticket's branch and `weighted_tokens` field; the branch queue is lib/fairness.lua's). A caller
-- taking many tickets in one call passes `later` to collect the ids instead of removing each from
-- the pending, delayed and deadline sets, and removes them with `remove_all` (from the pending set
-- before it reads that set again).
local function unqueue(id, pending_key, delayed_key, deadlines_key, waiting_key, depth_key, tokens_key,
                       branch, weighted, later)
  if depth_key and branch then redis.call('ZREM', depth_key .. ':' .. branch, id) end
  if later then
    later[#later + 1] = id
  else
    redis.call('ZREM', pending_key, id)
    redis.call('ZREM', delayed_key, id)
    redis.call('ZREM', deadlines_key, id)
  end
  if redis.call('ZREM', waiting_key, id) == 1 then
    count_branch(depth_key, tokens_key, branch, -1, weighted)
  end
end

-- The retention spec every ending script gets from Python (shared/policy.py `retention_spec`):
-- "<done> <failed> <expired> <cancelled> <keep prompts 1|0>", seconds per outcome. Parsed once per
-- script call (`retentions` keeps each spec's outcomes), not once per ticket ended.
local retentions = {}
local function retention_for(spec, status)
  local parsed = retentions[spec]
  if not parsed then
    local done, failed, expired, cancelled, keep =
      string.match(spec, '^(%d+) (%d+) (%d+) (%d+) ([01])$')
    parsed = {done = done, failed = failed, expired = expired, cancelled = cancelled, keep = keep == '1'}
    retentions[spec] = parsed
  end
  return parsed[status], parsed.keep
end

-- End a ticket: stamp the terminal status, start its outcome's retention clock (dropping the
-- prompt when the policy keeps none), count the outcome and hand its callback (if any) to the
-- outbox, all in the caller's atomic step. A caller ending many tickets in one call passes `batch`
-- to spend fewer commands on each: `batch.set` holds more field/value pairs for the same HSET
-- (written before the terminal fields, which win), `batch.callback` whether the ticket has a
-- callback (read with the caller's own HMGET), and `batch.counts` collects the outcome counts for
-- `add_counts` to write once per outcome.
local function finish_ticket(ticket_key, id, ticket_type, status, now, retention, error_text,
                             counts_key, outbox_key, batch)
  local fields = batch and batch.set or {}
  local n = #fields
  fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'status', status, 'finished_at', now
  fields[n + 5], fields[n + 6] = 'token', ''
  if error_text ~= nil and error_text ~= '' then
    fields[n + 7], fields[n + 8] = 'error', error_text
  end
  redis.call('HSET', ticket_key, unpack(fields))
  local seconds, keep_prompt = retention_for(retention, status)
  if not keep_prompt then
    redis.call('HDEL', ticket_key, 'prompt', 'messages')
  end
  redis.call('EXPIRE', ticket_key, seconds)
  local outcome = ticket_type .. ':' .. status
  if batch and batch.counts then
    batch.counts[outcome] = (batch.counts[outcome] or 0) + 1
  else
    redis.call('HINCRBY', counts_key, outcome, 1)
  end
  local callback = batch and batch.callback
  if callback == nil then callback = redis.call('HEXISTS', ticket_key, 'callback_url') == 1 end
  if callback then
    redis.call('LPUSH', outbox_key, id)
  end
end

-- Write the outcome counts a batch collected (`finish_ticket`'s `batch.counts`), one HINCRBY each.
local function add_counts(counts_key, counts)
  for outcome, count in pairs(counts) do
    redis.call('HINCRBY', counts_key, outcome, count)
  end
end

-- Remove `ids` (from the `from`-th on, 1 when not given) from the sorted set `key` in variadic
-- ZREMs (a bounded number of arguments each).
local function remove_all(key, ids, from)
  for first = from or 1, #ids, 500 do
    redis.call('ZREM', key, unpack(ids, first, math.min(first + 499, #ids)))
  end
end

-- Add the flat score, member list `pairs` to the sorted set `key` in variadic ZADDs.
local function add_all(key, pairs)
  for first = 1, #pairs, 1000 do
    redis.call('ZADD', key, unpack(pairs, first, math.min(first + 999, #pairs)))
  end
end

-- Move retries whose backoff is over from the delayed set back to the pending set at their score.
-- `prefix` is the ticket-hash prefix the caller got in its KEYS. Returns the ids moved.
local function promote_due(delayed_key, pending_key, prefix, now, limit)
  local promoted = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', delayed_key, '-inf', now, 'LIMIT', 0, limit)) do
    redis.call('ZREM', delayed_key, id)
    local score = redis.call('HGET', prefix .. id, 'score')
    if score then
      redis.call('ZADD', pending_key, score, id)
      promoted[#promoted + 1] = id
    end
  end
  return promoted
end

-- Leave `count` wake-up markers for idle workers, keeping at most `cap` in the list.
local function wake_workers(wake_key, count, cap)
  local markers = {}
  for i = 1, math.min(count, cap) do
    markers[i] = '1'
  end
  if #markers > 0 then
    redis.call('LPUSH', wake_key, unpack(markers))
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
