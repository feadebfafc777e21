/**
 * The Redis side of the store: one Lua script per operation, each atomic and
 * timed by the Redis server's own clock (`TIME`), never an instance's. The
 * arithmetic mirrors `Algorithm.ts`; the contract tests hold the two together.
 *
 * Scores and times are integer microseconds, formatted with `%.0f` so that no
 * value goes through Lua's 14-digit `tostring`.
 */
import { createHash } from "node:crypto"

export interface Script {
  readonly source: string
  readonly sha: string
}

const script = (body: string): Script => {
  const source = `${PRELUDE}\n${body}`
  return { source, sha: createHash("sha1").update(source).digest("hex") }
}

const PRELUDE = `
local function now_micros()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(x) return string.format('%.0f', x) end
local DAY = 86400000000
local function period_index(period, now)
  local day = math.floor(now / DAY)
  if period == 'day' then return day end
  return math.floor((day + 3) / 7)
end
local function period_end(period, index)
  if period == 'day' then return (index + 1) * DAY end
  return ((index + 1) * 7 - 3) * DAY
end
-- rates: name, limit, period, interval, tolerance; quotas: name, limit, period; then concurrency limit, queue
local function parse(argv, i)
  local rates, quotas = {}, {}
  local n = tonumber(argv[i]); i = i + 1
  for k = 1, n do
    rates[k] = { name = argv[i], limit = tonumber(argv[i + 1]), period = tonumber(argv[i + 2]),
                 interval = tonumber(argv[i + 3]), tolerance = tonumber(argv[i + 4]) }
    i = i + 5
  end
  n = tonumber(argv[i]); i = i + 1
  for k = 1, n do
    quotas[k] = { name = argv[i], limit = tonumber(argv[i + 1]), period = argv[i + 2] }
    i = i + 3
  end
  return rates, quotas, tonumber(argv[i]), tonumber(argv[i + 1])
end
local function rate_wait(r, tat, pending, now)
  if r.interval < 0 then return r.period end
  return math.max(0, math.max(tat, now) + pending * r.interval - r.tolerance - now)
end
local function rate_states(rates, tats, pending, now)
  local out = {}
  for k, r in ipairs(rates) do
    if r.interval < 0 then
      out[#out + 1] = 0; out[#out + 1] = r.period
    else
      local v = math.max(tats[k], now) + pending * r.interval
      out[#out + 1] = math.max(0, math.floor((now + r.tolerance - v) / r.interval) + 1)
      out[#out + 1] = v - now
    end
  end
  return out
end
local function read_tats(key, rates)
  local tats = {}
  for k, r in ipairs(rates) do tats[k] = tonumber(redis.call('HGET', key, r.name)) or 0 end
  return tats
end
local function quota_count(key, q, now)
  local idx = period_index(q.period, now)
  local stored = redis.call('HMGET', key, q.name .. '#i', q.name .. '#c')
  if stored[1] and tonumber(stored[1]) == idx then return tonumber(stored[2]) or 0, idx end
  return 0, idx
end
-- leases: a crashed instance stops renewing, and what it held comes back
local function expire_slots(slots, meta, now)
  local gone = redis.call('ZRANGEBYSCORE', slots, '-inf', fmt(now))
  for _, permit in ipairs(gone) do redis.call('HDEL', meta, 'a:' .. permit) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', slots, '-inf', fmt(now)) end
end
local function expire_queue(queue, lease, now)
  local gone = redis.call('ZRANGEBYSCORE', lease, '-inf', fmt(now))
  for _, permit in ipairs(gone) do redis.call('ZREM', queue, permit) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', lease, '-inf', fmt(now)) end
end
local function hold(key, ttl_ms)
  if redis.call('PTTL', key) < ttl_ms then redis.call('PEXPIRE', key, ttl_ms) end
end
-- The commit of a request whose generation started at time 'at' (µs, <= now), sent later with its
-- release or renewal: charged as of 'at', so the rate window is the one an immediate commit would
-- have opened. Only while the permit is still pending: a second delivery changes nothing.
local function commit_at(krate, kpres, kpsub, kquota, permit, rates, quotas, now, at)
  if not redis.call('ZSCORE', kpres, permit) then return 0 end
  local last = now
  for _, r in ipairs(rates) do
    if r.interval >= 0 then
      local tat = math.max(tonumber(redis.call('HGET', krate, r.name)) or 0, at) + r.interval
      redis.call('HSET', krate, r.name, fmt(tat))
      if tat > last then last = tat end
    end
  end
  -- An idle limiter (tat <= now) is the same as none, so the key may go once time catches up.
  if last > now then redis.call('PEXPIRE', krate, math.ceil((last - now) / 1000) + 1000) end
  local horizon = 0
  for _, q in ipairs(quotas) do
    local idx = period_index(q.period, at)
    local stored = redis.call('HMGET', kquota, q.name .. '#i', q.name .. '#c')
    local count, sidx = 0, tonumber(stored[1])
    -- Counted in a later period when one began meanwhile (never in a period already reset).
    if sidx and sidx >= idx then idx = sidx; count = tonumber(stored[2]) or 0 end
    redis.call('HSET', kquota, q.name .. '#i', fmt(idx), q.name .. '#c', fmt(count + 1))
    horizon = math.max(horizon, period_end(q.period, idx) - now)
  end
  if horizon > 0 then hold(kquota, math.ceil(horizon / 1000) + 86400000) end
  redis.call('ZREM', kpres, permit)
  redis.call('ZREM', kpsub, permit)
  return 1
end
`

/**
 * KEYS: rate hash, pending (resource), pending (subject), quota hash, slots,
 * queue, queue leases, meta. ARGV: permit, lease µs, then the limits.
 * Reply: {status, wait µs or ahead, limit name or ewma, rate states…}.
 */
export const admit = script(`
local now = now_micros()
local permit, lease = ARGV[1], tonumber(ARGV[2])
local rates, quotas, climit, cqueue = parse(ARGV, 3)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', fmt(now))
expire_slots(KEYS[5], KEYS[8], now)
expire_queue(KEYS[6], KEYS[7], now)
local pending = redis.call('ZCARD', KEYS[2])
local tats = read_tats(KEYS[1], rates)
local wait, which = 0, ''
for k, r in ipairs(rates) do
  local w = rate_wait(r, tats[k], pending, now)
  if w > wait then wait = w; which = r.name end
end
local reserved = redis.call('ZCARD', KEYS[3])
for _, q in ipairs(quotas) do
  local count, idx = quota_count(KEYS[4], q, now)
  if count + reserved + 1 > q.limit then
    local w = 1000000
    if count >= q.limit then w = period_end(q.period, idx) - now end
    if w > wait then wait = w; which = q.name end
  end
end
if wait > 0 then return { 'rate', fmt(wait), which, rate_states(rates, tats, pending, now) } end
local status = 'admitted'
local ttl = math.ceil(lease / 1000) + 1000
if climit >= 0 then
  local used, queued = redis.call('ZCARD', KEYS[5]), redis.call('ZCARD', KEYS[6])
  if climit > 0 and used + queued < climit then
    redis.call('ZADD', KEYS[5], fmt(now + lease), permit)
    redis.call('HSET', KEYS[8], 'a:' .. permit, fmt(now))
    hold(KEYS[5], ttl)
  elseif climit > 0 and queued < cqueue then
    local seq = redis.call('HINCRBY', KEYS[8], 'seq', 1)
    redis.call('ZADD', KEYS[6], seq, permit)
    redis.call('ZADD', KEYS[7], fmt(now + lease), permit)
    hold(KEYS[6], ttl); hold(KEYS[7], ttl)
    status = 'queued'
  else
    local ewma = redis.call('HGET', KEYS[8], 'ewma') or '-1'
    return { 'concurrency', fmt(queued + math.max(0, used - climit)), ewma,
             rate_states(rates, tats, pending, now) }
  end
  hold(KEYS[8], 86400000)
end
redis.call('ZADD', KEYS[2], fmt(now + lease), permit)
redis.call('ZADD', KEYS[3], fmt(now + lease), permit)
hold(KEYS[2], ttl); hold(KEYS[3], ttl)
return { status, '0', '', rate_states(rates, tats, pending + 1, now) }
`)

/**
 * KEYS: slots, queue, queue leases, meta, pending (resource), pending (subject).
 * ARGV: permit, lease µs, limit. Reply: {status, ahead, ewma}.
 */
export const poll = script(`
local now = now_micros()
local permit, lease, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
expire_slots(KEYS[1], KEYS[4], now)
expire_queue(KEYS[2], KEYS[3], now)
local ewma = redis.call('HGET', KEYS[4], 'ewma') or '-1'
local rank = redis.call('ZRANK', KEYS[2], permit)
if not rank then return { 'lost', '0', ewma } end
local used = redis.call('ZCARD', KEYS[1])
local ttl = math.ceil(lease / 1000) + 1000
redis.call('ZADD', KEYS[5], 'XX', fmt(now + lease), permit)
redis.call('ZADD', KEYS[6], 'XX', fmt(now + lease), permit)
if used + rank < limit then
  redis.call('ZREM', KEYS[2], permit)
  redis.call('ZREM', KEYS[3], permit)
  redis.call('ZADD', KEYS[1], fmt(now + lease), permit)
  redis.call('HSET', KEYS[4], 'a:' .. permit, fmt(now))
  hold(KEYS[1], ttl); hold(KEYS[4], 86400000)
  return { 'acquired', '0', ewma }
end
redis.call('ZADD', KEYS[3], 'XX', fmt(now + lease), permit)
hold(KEYS[2], ttl); hold(KEYS[3], ttl); hold(KEYS[5], ttl); hold(KEYS[6], ttl)
return { 'waiting', fmt(rank + math.max(0, used - limit)), ewma }
`)

/**
 * KEYS: slots, queue, queue leases, meta, pending (resource), pending (subject),
 * rate hash, quota hash. ARGV: permit, committed (1/0), µs since generation
 * started when that commit was not sent yet (else ''), then the limits.
 * Reply: 1 when a slot was freed.
 */
export const release = script(`
local now = now_micros()
local permit, committed = ARGV[1], ARGV[2] == '1'
if committed and ARGV[3] ~= '' then
  local rates, quotas = parse(ARGV, 4)
  commit_at(KEYS[7], KEYS[5], KEYS[6], KEYS[8], permit, rates, quotas, now, now - tonumber(ARGV[3]))
end
local acquired = tonumber(redis.call('HGET', KEYS[4], 'a:' .. permit))
local held = redis.call('ZREM', KEYS[1], permit)
redis.call('HDEL', KEYS[4], 'a:' .. permit)
redis.call('ZREM', KEYS[2], permit)
redis.call('ZREM', KEYS[3], permit)
redis.call('ZREM', KEYS[5], permit)
redis.call('ZREM', KEYS[6], permit)
-- Refunded requests leave no trace, not even in the hold-time estimate.
if committed and held == 1 and acquired then
  local previous = tonumber(redis.call('HGET', KEYS[4], 'ewma'))
  local sample = now - acquired
  local ewma = sample
  if previous then ewma = math.floor(0.8 * previous + 0.2 * sample) end
  redis.call('HSET', KEYS[4], 'ewma', fmt(ewma))
  hold(KEYS[4], 86400000)
end
return held
`)

/**
 * KEYS: slots, meta, pending (resource), pending (subject), rate hash, quota hash.
 * ARGV: permit, lease µs, committed (1/0), has a slot (1/0), µs since
 * generation started when that commit was not sent yet (else ''), then the limits.
 */
export const renew = script(`
local now = now_micros()
local permit, lease = ARGV[1], tonumber(ARGV[2])
local ttl = math.ceil(lease / 1000) + 1000
if ARGV[3] == '1' and ARGV[5] ~= '' then
  local rates, quotas = parse(ARGV, 6)
  commit_at(KEYS[5], KEYS[3], KEYS[4], KEYS[6], permit, rates, quotas, now, now - tonumber(ARGV[5]))
end
if ARGV[4] == '1' then
  -- Still running, so still holding: a lease that lapsed (a long pause) is taken again.
  if redis.call('ZADD', KEYS[1], fmt(now + lease), permit) == 1 then
    redis.call('HSET', KEYS[2], 'a:' .. permit, fmt(now))
    hold(KEYS[2], 86400000)
  end
  hold(KEYS[1], ttl)
end
if ARGV[3] ~= '1' then
  redis.call('ZADD', KEYS[3], 'XX', fmt(now + lease), permit)
  redis.call('ZADD', KEYS[4], 'XX', fmt(now + lease), permit)
  hold(KEYS[3], ttl); hold(KEYS[4], ttl)
end
return 1
`)

/**
 * Read-only. KEYS: pending (subject), quota hash, slots, queue leases, then a
 * rate hash and a pending set per resource. ARGV: the limits.
 * Reply: {slots, queued, {rate states per resource…}, {remaining, reset per quota…}}.
 */
export const usage = script(`
local now = now_micros()
local rates, quotas = parse(ARGV, 1)
local live = '(' .. fmt(now)
local slots = redis.call('ZCOUNT', KEYS[3], live, '+inf')
local queued = redis.call('ZCOUNT', KEYS[4], live, '+inf')
local per_resource = {}
local k = 5
while KEYS[k] do
  local pending = redis.call('ZCOUNT', KEYS[k + 1], live, '+inf')
  per_resource[#per_resource + 1] = rate_states(rates, read_tats(KEYS[k], rates), pending, now)
  k = k + 2
end
local reserved = redis.call('ZCOUNT', KEYS[1], live, '+inf')
local quota_states = {}
for _, q in ipairs(quotas) do
  local count, idx = quota_count(KEYS[2], q, now)
  quota_states[#quota_states + 1] = math.max(0, q.limit - count - reserved)
  quota_states[#quota_states + 1] = fmt(period_end(q.period, idx) - now)
end
return { slots, queued, per_resource, quota_states }
`)
