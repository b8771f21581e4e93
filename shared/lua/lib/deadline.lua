--[[
The deadline rule of enqueue.lua, apart from its cap and fair-share rules: a ticket that cannot
start before its deadline is refused at once (code deadline_unreachable) instead of waiting to be
answered when nobody needs the answer. They take keys as arguments; they build no keys.

The wait is estimated as (queued tickets whose score is at most this one's, so of equal or better
priority after aging and turns, less the slots the live workers have free: those start at once)
÷ (tickets per second workers can run to the end, the monitor's service rate, less the arrivals of
better types, which will start ahead of it). A rate measured while the workers had room is what
they were given, not what they can do, so without the free slots an idle queue's first tickets
were refused on it. Tickets that
expire unstarted leave fast without GPU time, so a drain rate would flatter the estimate.
Counting by score is exact and O(log n) on the pending set, with no running sums to keep right in
every script that moves a ticket. With no fresh measurement (no monitor, or none drained yet) a
ticket is admitted: the rule refuses only on evidence.
]]

-- As shared/control.py STALE_AFTER_SECONDS: an older monitor figure is not trusted.
local DRAIN_STALE_SECONDS = 5
-- As producer/admission.py RETRY_AFTER_MAX: the longest Retry-After given.
local MAX_RETRY_AFTER = 60
-- Share of a ticket's SLO left for its answer: it must be estimated to start that long before its
-- deadline. Starting just in time admitted tickets the worker then ended unstarted (its own rule
-- keeps a moment for the answer) or answered late.
local RUN_SHARE = 0.25

-- The first sighting of a request whose earlier try was shed (its record `old_key`), read before
-- the record is replaced: the new try's deadline still counts from it.
local function first_sighting(old_key)
  local seen = redis.call('HMGET', old_key, 'first_seen_at', 'created_at')
  return tonumber(seen[1] or '') or tonumber(seen[2] or '')
end

-- What the monitor last published of the workers' service (`monitor_key`), read once per script
-- call (it does not change while the script runs): nil when no fresh service rate is known, else
-- the rate the workers can do (the monitor's recent peak, the current rate when higher) less the
-- arrivals of the types served ahead (`ahead_types`, comma-separated; those keep starting first)
-- and the slots the live workers have free (those start at once).
local function drain_figures(monitor_key, ahead_types, now)
  local fields = {'service_rate', 'service_peak', 'updated_at', 'free_slots'}
  for name in string.gmatch(ahead_types or '', '[^,]+') do fields[#fields + 1] = 'arrival_rate:' .. name end
  local m = redis.call('HMGET', monitor_key, unpack(fields))
  local rate, at = tonumber(m[1] or ''), tonumber(m[3] or '')
  if not rate or not at or now - at > DRAIN_STALE_SECONDS then return nil end
  rate = math.max(rate, tonumber(m[2] or '') or 0)
  if rate <= 0 then return nil end
  local left = rate
  for i = 5, #m do left = left - (tonumber(m[i] or '') or 0) end
  return {rate = left, free = tonumber(m[4] or '') or 0}
end

-- Seconds until a ticket scored `score` would start given the monitor's `drain` figures, or nil
-- when there are none; none of the rate left after the types ahead: it would not start while they
-- keep coming (huge).
local function start_estimate(pending_key, drain, score)
  if not drain then return nil end
  local ahead = redis.call('ZCOUNT', pending_key, '-inf', score) - drain.free
  if ahead <= 0 then return 0 end
  if drain.rate <= 0 then return 1e9 end
  return ahead / drain.rate
end

-- The deadline rule: nil to admit, else the seconds after which a request like this one could
-- start within the same time to spare (its Retry-After). The caller passes only tickets the rule
-- may refuse (not critical). The start must come `RUN_SHARE` of its SLO (`slo`) before the deadline.
local function deadline_refusal(pending_key, drain, score, now, deadline, slo)
  local wait = start_estimate(pending_key, drain, score)
  local latest = deadline - RUN_SHARE * slo
  if not wait or now + wait <= latest then return nil end
  return math.min(math.max(1, wait - math.max(latest - now, 0)), MAX_RETRY_AFTER)
end
