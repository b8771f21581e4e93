--[[
Rejected records, small and sharing storage (read back by shared/rejected.py).

A shed submission's record is one field of a bucket hash, not a key of its own: the bucket is the
ticket prefix, "~" (never in an id) and the id's first 7 characters (ids start with their creation
time, so a bucket holds the ids of about 33 seconds), the field is the id's other characters, the value the record's
values packed in the order of REJECTED_PACKED, after its shed code and Retry-After, joined by the
unit separator (\31). A bucket expires as a whole, the retention after its latest write, so every
record in it lives at least that long. Left out as derived: the status (`rejected`), expires_at
(created_at + ttl_seconds) and the idempotency key, which its index holds.

The index of a shed submission's idempotency key is a hash per retention-long window of time (the
idempotency prefix, "~", the window's number): field "<branch>:<key>", value the id. A retry looks
in this window's and the previous one's, so it finds the record for at least the retention.
]]

local REJECTED_PACKED = {'type', 'branch_id', 'priority', 'max_tokens', 'ttl_seconds', 'prompt_chars',
  'prompt_digest', 'created_at', 'first_seen_at'}
local REJECTED_BUCKET_CHARS = 7

local function rejected_slot(ticket_prefix, id)
  return ticket_prefix .. '~' .. string.sub(id, 1, REJECTED_BUCKET_CHARS),
    string.sub(id, REJECTED_BUCKET_CHARS + 1)
end

-- Write (or overwrite) `id`'s record; ARGV[first..last] are its lean field/value pairs, `first_seen`
-- a retry's first sighting ("" for a first try).
local function record_rejected(ticket_prefix, id, code, retry_after, first, last, first_seen, seconds)
  local given = {first_seen_at = first_seen}
  for i = first, last, 2 do given[ARGV[i]] = ARGV[i + 1] end
  if given['created_at'] then given['created_at'] = string.format('%.3f', tonumber(given['created_at'])) end
  local packed = {code, retry_after}
  for i = 1, #REJECTED_PACKED do packed[i + 2] = given[REJECTED_PACKED[i]] or '' end
  local bucket, field = rejected_slot(ticket_prefix, id)
  redis.call('HSET', bucket, field, table.concat(packed, '\31'))
  redis.call('EXPIRE', bucket, seconds)
end

-- When the request behind `id`'s record was first seen (its first try's time), or nil.
local function rejected_first_sighting(ticket_prefix, id)
  local bucket, field = rejected_slot(ticket_prefix, id)
  local packed = redis.call('HGET', bucket, field)
  if not packed then return nil end
  local values = {}
  for value in string.gmatch(packed .. '\31', '([^\31]*)\31') do values[#values + 1] = value end
  local named = {}
  for i = 1, #REJECTED_PACKED do named[REJECTED_PACKED[i]] = values[i + 2] end
  return tonumber(named['first_seen_at'] or '') or tonumber(named['created_at'] or '')
end

local function forget_rejected(ticket_prefix, id)
  local bucket, field = rejected_slot(ticket_prefix, id)
  redis.call('HDEL', bucket, field)
end

local function rejected_index(idempotency_prefix, now, seconds, back)
  return idempotency_prefix .. '~' .. tostring(math.floor(tonumber(now) / tonumber(seconds)) - back)
end

-- The id of a live rejected record filed under `name` ("<branch>:<key>"), or nil.
local function find_rejected_key(idempotency_prefix, ticket_prefix, now, seconds, name)
  for back = 0, 1 do
    local id = redis.call('HGET', rejected_index(idempotency_prefix, now, seconds, back), name)
    if id then
      local bucket, field = rejected_slot(ticket_prefix, id)
      if redis.call('HEXISTS', bucket, field) == 1 then return id end
    end
  end
  return nil
end

local function remember_rejected_key(idempotency_prefix, now, seconds, name, id)
  local index = rejected_index(idempotency_prefix, now, seconds, 0)
  redis.call('HSET', index, name, id)
  redis.call('EXPIRE', index, 2 * tonumber(seconds))
end
