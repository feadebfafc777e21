/**
 * The billing book in Redis: one Lua script per operation, each atomic, with
 * the same checks in the same order as `Book.ts`. Every key of the book shares
 * one hash tag (`{billing}`), so a script may touch an account, a key and the
 * hold index together, also on Redis Cluster (one shard).
 *
 * Times come in as arguments (the instance's clock, in ms): the month of a
 * charge and the expiry of a hold are decided the way the memory book decides
 * them, and tests drive both books with the same `TestClock`. Amounts are
 * integer micro-dollars; HINCRBY keeps them exact, comparisons stay far below
 * 2^53.
 *
 * Layout under `<prefix>{billing}:`
 *   a:<account>  hash  bal (credits − settled charges), cred (credits seen), held, month, spm,
 *                      seeded (when it was seeded from the ledger)
 *   k:<key>      hash  spent, held, seeded
 *   h            hash  request id → hold (JSON)
 *   hx           zset  request id → due: min(expiry, lease); past it the hold is voided
 *   q            list  settled charges not yet claimed by a ledger writer (JSON)
 *   w, wx        hash + zset  charges claimed by a writer, with the claim's deadline
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
local function num(x) return tonumber(x) or 0 end
local function fmt(x) return string.format('%.0f', x) end
local function touch(key, ttl) redis.call('PEXPIRE', key, ttl) end
-- moves the account's monthly figure to the month starting at month_start
local function roll(a, month_start)
  if num(redis.call('HGET', a, 'month')) < month_start then
    redis.call('HSET', a, 'month', fmt(month_start), 'spm', 0)
  end
end
-- Lua's tostring keeps 14 digits: every computed number goes to Redis through fmt
-- drops a hold and its amount from the account's and the key's open holds
local function release(prefix, h, hx, id)
  local raw = redis.call('HGET', h, id)
  if not raw then return nil end
  local hold = cjson.decode(raw)
  redis.call('HDEL', h, id)
  redis.call('ZREM', hx, id)
  redis.call('HINCRBY', prefix .. 'a:' .. hold.a, 'held', fmt(-hold.amt))
  redis.call('HINCRBY', prefix .. 'k:' .. hold.k, 'held', fmt(-hold.amt))
  return hold
end
`

/**
 * KEYS: account, key, holds, hold index. ARGV: request id, account id, key
 * id, prompt and completion price (micros per million tokens), prompt
 * tokens, completion cap, payment hold (0/1), monthly limit (-1: none), key
 * limit (-1: none), month start, due, expiry, ttl of the account and key
 * hashes.
 * Decides as `Book.grant` does: a limit whose headroom (settled spend only)
 * cannot pay the prompt and one token refuses; when other holds leave less
 * than that, 'held_by_others'; else the worst case, or all that is left with
 * the cap it buys.
 * Reply: {'ok', amount, cap}, 'missing' (load first), 'duplicate', the
 * refusal, or 'held_by_others'.
 */
export const reserve = script(`
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('EXISTS', KEYS[2]) == 0 then return 'missing' end
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then return 'duplicate' end
local pp, cp = tonumber(ARGV[4]), tonumber(ARGV[5])
local prompt, max_tokens = tonumber(ARGV[6]), tonumber(ARGV[7])
local monthly, key_limit = tonumber(ARGV[9]), tonumber(ARGV[10])
local function cost(c) return math.ceil((prompt * pp + c * cp) / 1000000) end
roll(KEYS[1], tonumber(ARGV[11]))
local a = redis.call('HMGET', KEYS[1], 'bal', 'held', 'spm')
local bal, held, spm = num(a[1]), num(a[2]), num(a[3])
local k = redis.call('HMGET', KEYS[2], 'spent', 'held')
local spent, kheld = num(k[1]), num(k[2])
local minimum = cost(math.min(1, max_tokens))
if bal < minimum then
  if ARGV[8] == '1' then return 'payment_hold' end
  return 'insufficient_balance'
end
local free = bal - held
if monthly >= 0 then
  if monthly - spm < minimum then return 'account_spend_limit' end
  free = math.min(free, monthly - spm - held)
end
if key_limit >= 0 then
  if key_limit - spent < minimum then return 'key_spend_limit' end
  free = math.min(free, key_limit - spent - kheld)
end
if free < minimum then return 'held_by_others' end
local cap = max_tokens
local amount = cost(cap)
if amount > free then
  if cp == 0 then cap = max_tokens else
    cap = math.max(1, math.min(max_tokens, math.floor((free * 1000000 - prompt * pp) / cp)))
    while cap > 1 and cost(cap) > free do cap = cap - 1 end
    while cap < max_tokens and cost(cap + 1) <= free do cap = cap + 1 end
  end
  amount = cost(cap)
end
redis.call('HINCRBY', KEYS[1], 'held', fmt(amount))
redis.call('HINCRBY', KEYS[2], 'held', fmt(amount))
redis.call('HSET', KEYS[3], ARGV[1], '{"a":' .. cjson.encode(ARGV[2]) .. ',"k":' .. cjson.encode(ARGV[3]) ..
  ',"amt":' .. fmt(amount) .. ',"x":' .. ARGV[13] .. '}')
redis.call('ZADD', KEYS[4], ARGV[12], ARGV[1])
touch(KEYS[1], tonumber(ARGV[14])); touch(KEYS[2], tonumber(ARGV[14]))
return {'ok', fmt(amount), fmt(cap)}
`)

/**
 * KEYS: holds, hold index, queue. ARGV: prefix, request id, charge (already
 * capped at the hold by the caller), month start, usage entry JSON.
 * Reply: 1 when charged, 0 when the hold was already resolved (settled,
 * voided or expired): exactly once per request id.
 */
export const settle = script(`
local hold = release(ARGV[1], KEYS[1], KEYS[2], ARGV[2])
if not hold then return 0 end
local charge = math.max(0, math.min(tonumber(ARGV[3]), hold.amt))
local a = ARGV[1] .. 'a:' .. hold.a
roll(a, tonumber(ARGV[4]))
redis.call('HINCRBY', a, 'bal', fmt(-charge))
-- Counted in the month the account is in, even for a settlement of an earlier one (sent late, or from
-- an instance whose clock is behind): a month's spend is never less than what ran in it.
redis.call('HINCRBY', a, 'spm', fmt(charge))
redis.call('HINCRBY', ARGV[1] .. 'k:' .. hold.k, 'spent', fmt(charge))
redis.call('RPUSH', KEYS[3], ARGV[5])
return 1
`)

/** KEYS: holds, hold index. ARGV: prefix, request id. Reply: 1 when voided. */
export const voidHold = script(`
if release(ARGV[1], KEYS[1], KEYS[2], ARGV[2]) then return 1 end
return 0
`)

/**
 * KEYS: holds, hold index. ARGV: prefix, now, most to expire.
 * Voids the holds past their due time (expiry, or a lease nobody renewed:
 * the instance that placed them is gone). Reply: their request ids.
 */
export const expire = script(`
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(due) do
  if not release(ARGV[1], KEYS[1], KEYS[2], id) then redis.call('ZREM', KEYS[2], id) end
end
return due
`)

/**
 * KEYS: holds, hold index. ARGV: lease end, request ids…
 * Extends the lease of the caller's open holds (never past their expiry).
 * Reply: the ids that are no longer open.
 */
export const renew = script(`
local gone = {}
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local hold = cjson.decode(raw)
    redis.call('ZADD', KEYS[2], 'XX', fmt(math.min(hold.x, tonumber(ARGV[1]))), ARGV[i])
  else
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
`)

/**
 * KEYS: account hashes… ARGV: ttl, seed time, then per account: balance,
 * credits, month start, month spend. Seeds each account from the ledger unless Redis already
 * has it: instances starting together, or racing on a new account, agree on
 * the first seed. Reply: how many were seeded.
 */
export const loadAccounts = script(`
local seeded = 0
for i, a in ipairs(KEYS) do
  if redis.call('EXISTS', a) == 0 then
    local j = 3 + (i - 1) * 4
    redis.call('HSET', a, 'bal', ARGV[j], 'cred', ARGV[j + 1], 'held', 0, 'month', ARGV[j + 2], 'spm', ARGV[j + 3],
      'seeded', ARGV[2])
    touch(a, tonumber(ARGV[1]))
    seeded = seeded + 1
  end
end
return seeded
`)

/** KEYS: key hashes… ARGV: ttl, seed time, then each key's spend. Seeds the keys Redis lacks. */
export const loadKeys = script(`
local seeded = 0
for i, k in ipairs(KEYS) do
  if redis.call('EXISTS', k) == 0 then
    redis.call('HSET', k, 'spent', ARGV[i + 2], 'held', 0, 'seeded', ARGV[2])
    touch(k, tonumber(ARGV[1]))
    seeded = seeded + 1
  end
end
return seeded
`)

/**
 * KEYS: account. ARGV: the account's credits in the ledger (all time).
 * Credits only ever grow, so the difference to what the book has seen is new
 * money, whatever charges are being written meanwhile. Reply: what was added.
 */
export const credit = script(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local seen = num(redis.call('HGET', KEYS[1], 'cred'))
local total = tonumber(ARGV[1])
if total <= seen then return 0 end
redis.call('HINCRBY', KEYS[1], 'bal', fmt(total - seen))
redis.call('HSET', KEYS[1], 'cred', fmt(total))
return total - seen
`)

/**
 * KEYS: account hashes… ARGV: month start. Reply per account: {bal, held,
 * month spend} as strings, or false when Redis does not have it.
 */
export const money = script(`
local out = {}
for i, a in ipairs(KEYS) do
  if redis.call('EXISTS', a) == 1 then
    roll(a, tonumber(ARGV[1]))
    local v = redis.call('HMGET', a, 'bal', 'held', 'spm')
    out[i] = { v[1] or '0', v[2] or '0', v[3] or '0' }
  else
    out[i] = false
  end
end
return out
`)

/**
 * KEYS: queue, claimed, claim deadlines. ARGV: now, claim deadline, most.
 * Hands a writer the charges whose earlier claim ran out (its writer died)
 * and then the oldest unclaimed ones. Reply: entry JSONs.
 */
export const claim = script(`
local most = tonumber(ARGV[3])
local out = {}
local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1], 'LIMIT', 0, most)
for _, id in ipairs(stale) do
  local raw = redis.call('HGET', KEYS[2], id)
  if raw then
    redis.call('ZADD', KEYS[3], ARGV[2], id)
    out[#out + 1] = raw
  else
    redis.call('ZREM', KEYS[3], id)
  end
end
local room = most - #out
if room > 0 then
  local fresh = redis.call('LPOP', KEYS[1], room)
  if fresh then
    for _, raw in ipairs(fresh) do
      local id = cjson.decode(raw).requestId
      redis.call('HSET', KEYS[2], id, raw)
      redis.call('ZADD', KEYS[3], ARGV[2], id)
      out[#out + 1] = raw
    end
  end
end
return out
`)

/** KEYS: claimed, claim deadlines. ARGV: request ids written to the ledger. */
export const ack = script(`
for i = 1, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[2], ARGV[i])
end
return #ARGV
`)

/**
 * KEYS: claimed, claim deadlines, queue. ARGV: request ids whose write failed.
 * Gives them back at once (front of the queue) instead of at the deadline.
 */
export const unclaim = script(`
for i = #ARGV, 1, -1 do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    redis.call('LPUSH', KEYS[3], raw)
  end
end
return #ARGV
`)

/**
 * KEYS: account, key. ARGV: charge, month start of the charge, when it was settled.
 * A charge settled while Redis was unreachable (`open` policy: the instance's
 * memory book held it) reaches the shared book. An account or key seeded from
 * the ledger after the charge already has it.
 */
export const apply = script(`
local charge, month, at = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[1]) == 1 and num(redis.call('HGET', KEYS[1], 'seeded')) < at then
  roll(KEYS[1], month)
  redis.call('HINCRBY', KEYS[1], 'bal', fmt(-charge))
  if num(redis.call('HGET', KEYS[1], 'month')) == month then redis.call('HINCRBY', KEYS[1], 'spm', fmt(charge)) end
end
if redis.call('EXISTS', KEYS[2]) == 1 and num(redis.call('HGET', KEYS[2], 'seeded')) < at then
  redis.call('HINCRBY', KEYS[2], 'spent', fmt(charge))
end
return 1
`)
