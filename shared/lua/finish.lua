--[[
Finish running tickets (done, failed for good, or expired unstarted: its deadline can no longer be
met when its worker took it), each only for the holder of its current lease:
a worker whose lease expired and was taken over holds a stale token and cannot write an answer.
Several tickets share one call (one round trip), each fenced on its own; the batch is checked
before anything is written, so a bad value refuses the whole call with an error naming the ticket
(its place from 1 and its id) and the field, and nothing is finished.

KEYS[1] inflight zset           {q}:inflight
KEYS[2] counts hash             {q}:counts
KEYS[3] outbox list             {q}:outbox
KEYS[4] ticket hash prefix      {q}:t:   (+ id; the prefix carries the queue's hash tag)

ARGV[1] now (Unix seconds)
ARGV[2] retention spec for tickets ended here (lib/tickets.lua `retention_for`)
then, per ticket: id, fencing token from the claim, final status ("done", "failed" or "expired"), error text
("" for none), f; then f field, value pairs to store (result, usage, first_token_at, ...)

Returns one reply per ticket in order: "ok", or "stale:<status>" when the caller no longer holds
that ticket's lease (nothing of it is written).
]]
-- @include tickets

local function bad(i, id, field, value, wanted)
  return redis.error_reply('ticket ' .. i .. ' (' .. id .. '): ' .. field .. ' ' .. string.format('%q', value) ..
    ' is not accepted; expected ' .. wanted)
end
local finals = {done = true, failed = true, expired = true}
local starts = {}
local at = 3
while at <= #ARGV do
  local i = #starts + 1
  local id = ARGV[at]
  local fields = tonumber(ARGV[at + 4])
  if not fields or at + 4 + 2 * fields > #ARGV then
    return bad(i, id, 'fields', ARGV[at + 4] or '', 'the count of the field pairs that follow')
  end
  if id == '' then return bad(i, id, 'id', id, 'a ticket id') end
  if not finals[ARGV[at + 2]] then
    return bad(i, id, 'status', ARGV[at + 2], '"done", "failed" or "expired"')
  end
  starts[i] = at
  at = at + 5 + 2 * fields
end

local replies = {}
local finished, counts = {}, {}
local batch = {counts = counts}
for i = 1, #starts do
  local at = starts[i]
  local id, key = ARGV[at], KEYS[4] .. ARGV[at]
  local t = redis.call('HMGET', key, 'status', 'token', 'type', 'callback_url')
  if t[1] ~= 'running' or t[2] ~= ARGV[at + 1] then
    replies[i] = 'stale:' .. (t[1] or 'missing')
  else
    batch.set = {unpack(ARGV, at + 5, at + 4 + 2 * tonumber(ARGV[at + 4]))}
    batch.callback = t[4] ~= false
    finished[#finished + 1] = id
    finish_ticket(key, id, t[3], ARGV[at + 2], ARGV[1], ARGV[2], ARGV[at + 3], KEYS[2], KEYS[3], batch)
    if ARGV[at + 2] == 'expired' then  -- the one expiry here: a deadline passed before the start
      counts[t[3] .. ':deadline_passed'] = (counts[t[3] .. ':deadline_passed'] or 0) + 1
    end
    replies[i] = 'ok'
  end
end
remove_all(KEYS[1], finished)
add_counts(KEYS[2], counts)
return replies
