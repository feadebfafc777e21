/**
 * The billing service for many instances: the book (balances, open holds,
 * month and key spend) lives in Redis, where every check-and-update is one
 * atomic script, so instances sharing a Redis can never jointly overspend.
 * The SQL ledger stays the durable truth, written in batches as by the memory
 * service.
 *
 * What differs from one instance with the book in memory:
 * - Holds are leases: the instance renews its open holds every third of
 *   `leaseMillis`; when it dies they stop being renewed and any instance's
 *   sweep returns their money within a lease and a sweep (`sweepMillis`).
 * - A settlement that cannot reach Redis is sent again every second until
 *   Redis answers: the request that ran is charged once it is back, unless
 *   its hold lapsed first (then it returned the money, uncharged) or the
 *   `open` policy's memory book stood in meanwhile (it may have spent it).
 * - Settled charges wait in a Redis queue, not in the process: any instance's
 *   writer claims a batch, writes it and acknowledges it. A writer that dies
 *   mid-batch loses its claim after `claimMillis` and another writes the
 *   batch; the request id as primary key keeps that exactly once.
 * - Credits made elsewhere (admin API on another instance, the CLI) are found
 *   by comparing the ledger's all-time credits with the credits the book has
 *   seen: credits only grow, so that needs no coordination with writers.
 * - The book is seeded from the ledger per account and key, only where Redis
 *   has nothing yet, so instances starting together agree on the first seed.
 */
import { SqlClient, type SqlError } from "@effect/sql"
import { IdTable, Observed } from "@swarmgate/protocol"
import { Database, Redis as R } from "@swarmgate/store"
import { Clock, type ConfigError, Effect, Exit, Layer, type Redacted, Scope } from "effect"
import type { Redis } from "ioredis"
import {
  type AccountMoney,
  Billing,
  type BillingOptions,
  type BillingShape,
  BillingUnavailable,
  config as billingConfig,
  defaults,
  type HoldSent,
  make as makeMemory,
  type ReserveInput,
  type ReserveRefusal,
  reserveWaiting,
  type Settlement,
} from "./Billing"
import * as BackgroundLoop from "./internal/BackgroundLoop"
import type { Hold, Shortfall } from "./internal/Book"
import { HELD_BY_OTHERS, startOfUtcMonth } from "./internal/Book"
import * as LedgerWriter from "./internal/LedgerWriter"
import * as Scripts from "./internal/RedisScripts"
import * as Ledger from "./Ledger"
import { costMicros } from "./Prices"

export interface RedisBillingOptions extends BillingOptions {
  readonly url: string | Redacted.Redacted
  /** Prepended to every key; instances that share money use the same prefix. */
  readonly prefix?: string | undefined
  /** An open hold survives this long without its instance renewing it. */
  readonly leaseMillis?: number | undefined
  /** A ledger writer's claim on a batch runs out after this; another writer takes it over. */
  readonly claimMillis?: number | undefined
  readonly commandTimeoutMillis?: number | undefined
  /**
   * Redis unreachable: `closed` (default) refuses reservations (the gateway answers 503);
   * `open` holds against this instance's own memory book instead — exact per instance, not
   * across them — and applies those charges to the shared book once Redis is back.
   */
  readonly onRedisFailure?: "closed" | "open" | undefined
}

export const DEFAULT_PREFIX = "swarmgate:"
export const DEFAULT_LEASE_MILLIS = 15_000
export const DEFAULT_CLAIM_MILLIS = 30_000
/** How often settlements that could not reach Redis are sent again. */
const LATE_SETTLE_MILLIS = 1_000
/** Settlements kept for a later send, at most; beyond, a failed one lapses as its hold does. */
const MAX_LATE_SETTLEMENTS = 100_000
/** How long a settlement is kept for a later send. */
const MAX_LATE_MILLIS = 60 * 60_000
/** At shutdown, how long the waiting settlements may still be sent. */
const SHUTDOWN_LATE_MILLIS = 5_000

/** A settlement that could not reach Redis: the usage record and the script's keys and arguments. */
interface LateSettlement {
  readonly entry: Ledger.UsageEntry
  readonly keys: ReadonlyArray<string>
  readonly args: ReadonlyArray<string | number>
  readonly since: number
}

/** Idle accounts and keys leave Redis after this; the next request seeds them from the ledger again. */
const IDLE_TTL_MILLIS = 30 * 24 * 3600 * 1000
const EXPIRE_BATCH = 1_000
const RENEW_BATCH = 500

const toNumber = Database.toNumber

const REFUSALS: ReadonlySet<string> = new Set<Shortfall>([
  "insufficient_balance",
  "payment_hold",
  "account_spend_limit",
  "key_spend_limit",
  HELD_BY_OTHERS,
])

/** How often a request waiting for other holds asks the shared book again. */
const WAIT_POLL_MILLIS = 50

/** Pure timer, not the Effect clock: shutdown waits in real time even under TestClock. */
const sleepReal = (millis: number) => Effect.promise(() => new Promise((r) => setTimeout(r, millis)))

/** A settlement that could not reach Redis, with when it failed (only after a Redis failure). */
const withSince = <T extends object>(settlement: T, since: number): T & { readonly since: number } => ({
  ...settlement,
  since,
})

const chunks = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size))
  return out
}

/** All-time credits per account, from the append-only movements. */
const readCredits = (ids: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const credits = new Map<string, number>()
    for (const batch of chunks(ids, 200)) {
      for (const id of batch) credits.set(id, 0)
      const rows = yield* sql<{ account_id: string; total: number | string }>`
        SELECT account_id, SUM(amount_micros) AS total FROM balance_movements
        WHERE kind = 'credit' AND ${sql.in("account_id", batch)} GROUP BY account_id`
      for (const row of rows) credits.set(row.account_id, toNumber(row.total))
    }
    return credits
  })

/**
 * Credits and committed charges per account in one statement, so a credit landing meanwhile is
 * either in both figures (balance and credits seen) or in neither.
 */
const readMovements = (ids: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ id: string; credits: number | string; charges: number | string }>`
      SELECT a.id AS id,
        COALESCE(SUM(CASE WHEN m.kind = 'credit' THEN m.amount_micros ELSE 0 END), 0) AS credits,
        COALESCE(SUM(CASE WHEN m.kind = 'charge' THEN m.amount_micros ELSE 0 END), 0) AS charges
      FROM accounts a LEFT JOIN balance_movements m ON m.account_id = a.id
      WHERE ${sql.in("a.id", ids)} GROUP BY a.id`
    return rows.map((r) => ({ id: r.id, credits: toNumber(r.credits), charges: toNumber(r.charges) }))
  })

const allAccountIds = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(sql<{ id: string }>`SELECT id FROM accounts`, (rows) => rows.map((r) => r.id)),
)

const allKeyIds = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(sql<{ id: string }>`SELECT id FROM api_keys`, (rows) => rows.map((r) => r.id)),
)

export const make = (
  options: RedisBillingOptions,
): Effect.Effect<BillingShape, SqlError.SqlError, SqlClient.SqlClient | Scope.Scope> =>
  Effect.gen(function* () {
    const withSql = yield* LedgerWriter.captureSql
    const flushMillis = options.flushMillis ?? defaults.flushMillis
    const batchMax = options.batchMax ?? defaults.batchMax
    const refreshMillis = options.refreshMillis ?? defaults.refreshMillis
    const sweepMillis = options.sweepMillis ?? defaults.sweepMillis
    const shutdownWaitMillis = options.shutdownWaitMillis ?? defaults.shutdownWaitMillis
    const leaseMillis = options.leaseMillis ?? DEFAULT_LEASE_MILLIS
    const claimMillis = options.claimMillis ?? DEFAULT_CLAIM_MILLIS
    const prices = options.prices
    const base = `${options.prefix ?? DEFAULT_PREFIX}{billing}:`
    const K = {
      account: (id: string) => `${base}a:${id}`,
      key: (id: string) => `${base}k:${id}`,
      holds: `${base}h`,
      holdIndex: `${base}hx`,
      queue: `${base}q`,
      claimed: `${base}w`,
      claimDeadlines: `${base}wx`,
    }

    const commandTimeoutMillis = options.commandTimeoutMillis ?? 1_000
    const redis: Redis = yield* R.shared(options.url, commandTimeoutMillis)
    const run = (script: Scripts.Script, keys: ReadonlyArray<string>, args: ReadonlyArray<string | number>) =>
      R.run(redis, script, keys, args)
    const unavailable =
      (reason: string) =>
      (cause: R.RedisFailure | SqlError.SqlError): BillingUnavailable =>
        new BillingUnavailable({
          reason: `${reason}: ${"reason" in cause ? cause.reason : cause.message}`,
          cause,
        })

    // The holds this instance placed and has not resolved: it renews their leases and settles them.
    const local = new IdTable<Hold>()
    // When this instance last re-read an account's credits after a refusal.
    const checkedAt = new Map<string, number>()
    let settledSinceWrite = 0
    const scope = yield* Effect.scope
    const wake = yield* Effect.makeLatch(false)
    const full = yield* Effect.makeLatch(false)

    // One warning every 10 s while Redis is away, not one per sweep or request.
    const throttled = R.throttledWarning(10_000)

    const priceOf = (model: string) => {
      const price = prices.get(model)
      if (price === undefined) throw new Error(`no price for model ${model}`)
      return price
    }
    const holdAmount = (model: string, promptTokens: number, maxTokens: number) =>
      costMicros(priceOf(model), promptTokens, maxTokens)

    // --- seeding from the ledger ------------------------------------------------------------

    const seed = (accountIds: ReadonlyArray<string>, keyIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const month = startOfUtcMonth(now)
        for (const batch of chunks(accountIds, 200)) {
          const movements = yield* readMovements(batch).pipe(
            withSql,
            Effect.mapError(unavailable("could not load balances")),
          )
          if (movements.length === 0) continue
          // Charges of an account Redis lacks are all committed: only a seeded account is ever charged.
          const spent = yield* Ledger.loadAccounts(batch, month).pipe(
            withSql,
            Effect.mapError(unavailable("could not load month spend")),
          )
          const spentMonth = new Map(spent.map((a) => [a.id, a.spentMonthMicros]))
          const args: Array<string | number> = [IDLE_TTL_MILLIS, now]
          for (const a of movements)
            args.push(a.credits - a.charges, a.credits, month, spentMonth.get(a.id) ?? 0)
          yield* run(
            Scripts.loadAccounts,
            movements.map((a) => K.account(a.id)),
            args,
          ).pipe(Effect.mapError(unavailable("could not seed balances")))
        }
        for (const batch of chunks(keyIds, 200)) {
          const keys = yield* Ledger.loadKeys(batch).pipe(
            withSql,
            Effect.mapError(unavailable("could not load key spend")),
          )
          if (keys.size === 0) continue
          yield* run(Scripts.loadKeys, [...keys.keys()].map(K.key), [
            IDLE_TTL_MILLIS,
            now,
            ...keys.values(),
          ]).pipe(Effect.mapError(unavailable("could not seed key spend")))
        }
      })

    const missing = (keys: ReadonlyArray<string>) =>
      Effect.map(
        R.command(() => Promise.all(keys.map((key) => redis.exists(key)))),
        (found) => keys.filter((_, i) => found[i] === 0),
      )

    /** Seeds whatever of these accounts and keys Redis does not have yet. */
    const ensure = (accountIds: ReadonlyArray<string>, keyIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const absentAccounts = accountIds.length === 0 ? [] : yield* missing(accountIds.map(K.account))
        const absentKeys = keyIds.length === 0 ? [] : yield* missing(keyIds.map(K.key))
        if (absentAccounts.length === 0 && absentKeys.length === 0) return
        yield* seed(
          accountIds.filter((id) => absentAccounts.includes(K.account(id))),
          keyIds.filter((id) => absentKeys.includes(K.key(id))),
        )
      }).pipe(Effect.catchTag("RedisFailure", (e) => Effect.fail(unavailable("redis")(e))))

    /** New credits in the ledger reach the book; safe at any time, from any instance. */
    const refreshCredits = (accountIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        if (accountIds.length === 0) return
        const credits = yield* readCredits(accountIds).pipe(
          withSql,
          Effect.mapError(unavailable("could not read credits")),
        )
        yield* Effect.forEach(credits, ([id, total]) => run(Scripts.credit, [K.account(id)], [total]), {
          concurrency: 16,
          discard: true,
        }).pipe(Effect.mapError(unavailable("could not record credits")))
      })

    // Rebuild: seed everything the ledger knows that Redis lacks. Redis away at start is not
    // fatal — accounts are seeded on first use — as limits start without it too.
    yield* Effect.gen(function* () {
      const accounts = yield* allAccountIds.pipe(withSql)
      const keys = yield* allKeyIds.pipe(withSql)
      yield* seed(accounts, keys)
    }).pipe(
      Effect.catchTag("BillingUnavailable", (e) =>
        Effect.logWarning(
          `billing: seeding Redis from the ledger failed (${e.reason}); seeding on first use`,
        ),
      ),
    )

    // --- the request path ---------------------------------------------------------------------

    const reserveKeys = (input: ReserveInput) => [
      K.account(input.accountId),
      K.key(input.keyId),
      K.holds,
      K.holdIndex,
    ]
    const reserveArgs = (input: ReserveInput, now: number) => {
      const price = priceOf(input.model)
      const expiresAt = now + input.ttlMillis
      const due = Math.min(expiresAt, now + leaseMillis)
      return [
        input.requestId,
        input.accountId,
        input.keyId,
        price.promptMicrosPerMillion,
        price.completionMicrosPerMillion,
        input.promptTokens,
        input.maxTokens,
        input.paymentHold ? 1 : 0,
        input.monthlySpendLimitMicros ?? -1,
        input.keySpendLimitMicros ?? -1,
        startOfUtcMonth(now),
        due,
        expiresAt,
        IDLE_TTL_MILLIS,
      ]
    }
    type ReserveReply = string | { readonly amount: number; readonly cap: number }
    const reserveReply = (reply: unknown): ReserveReply =>
      Array.isArray(reply) ? { amount: Number(reply[1]), cap: Number(reply[2]) } : String(reply)
    const couldNotHold = unavailable("could not place the hold")

    const reserveOnce = (input: ReserveInput, now: number) =>
      Effect.map(run(Scripts.reserve, reserveKeys(input), reserveArgs(input, now)), reserveReply)

    // Request-path generator bodies are declared once per book, not made per call (gateway/HttpServer.ts says why).

    /**
     * One try against the shared book, seeding it or re-reading credits once where that may help;
     * `sent`: its first command, sent already at `sentAt`.
     */
    function* reserveAttemptBody(
      input: ReserveInput,
      sent: Effect.Effect<ReserveReply, BillingUnavailable> | undefined,
      sentAt: number,
    ) {
      const now = sent === undefined ? yield* Clock.currentTimeMillis : sentAt
      const attempt = (at: number) => reserveOnce(input, at).pipe(Effect.mapError(couldNotHold))
      let result = yield* sent ?? attempt(now)
      if (result === "missing") {
        yield* ensure([input.accountId], [input.keyId])
        result = yield* attempt(now)
      }
      if (result === "insufficient_balance" || result === "payment_hold") {
        // Credit may have arrived through another process: look once, at most every refreshMillis.
        if (now - (checkedAt.get(input.accountId) ?? Number.NEGATIVE_INFINITY) >= refreshMillis) {
          checkedAt.set(input.accountId, now)
          yield* refreshCredits([input.accountId])
          result = yield* attempt(yield* Clock.currentTimeMillis)
        }
      }
      if (result === "missing") return yield* Effect.die(new Error(`reserve: unknown account or key`))
      if (result === "duplicate") return yield* Effect.die(new Error(`duplicate hold ${input.requestId}`))
      if (typeof result === "string") {
        if (REFUSALS.has(result)) return result as Shortfall
        return yield* Effect.die(new Error(`reserve: unexpected reply ${result}`))
      }
      return placed(input, result, now)
    }
    /** A hold the book placed: this instance renews its lease and resolves it. */
    const placed = (
      input: ReserveInput,
      result: { readonly amount: number; readonly cap: number },
      now: number,
    ) => {
      const hold: Hold = {
        requestId: input.requestId,
        accountId: input.accountId,
        keyId: input.keyId,
        model: input.model,
        promptTokens: input.promptTokens,
        amountMicros: result.amount,
        maxTokens: result.cap,
        createdAt: now,
        expiresAt: now + input.ttlMillis,
      }
      local.set(hold.requestId, hold)
      return hold
    }
    const reserveAttempt = (input: ReserveInput) => Effect.gen(() => reserveAttemptBody(input, undefined, 0))

    // Other instances settle holds too: a waiting request looks again at this interval.
    const released = (millis: number) => Effect.sleep(Math.min(millis, WAIT_POLL_MILLIS))

    const reserveShared = (input: ReserveInput) =>
      reserveWaiting(input.waitMillis ?? 0, reserveAttempt(input), released)

    // --- Redis unreachable ----------------------------------------------------------------------

    const redisDown = (e: BillingUnavailable) => e.cause instanceof R.RedisFailure
    const warnOutage = (what: string, e: BillingUnavailable) =>
      throttled(`billing: Redis unreachable (${e.reason}); ${what}`)

    // `open` policy: this instance's own memory book, created on the first outage, and the
    // charges it settled, to be applied to the shared book once Redis answers again.
    let fallback: BillingShape | undefined
    const fallbackHolds = new Set<string>()
    const replay: Array<{ accountId: string; keyId: string; charge: number; at: number }> = []
    const fallbackLock = yield* Effect.makeSemaphore(1)
    const memoryBook = fallbackLock.withPermits(1)(
      Effect.suspend(() =>
        fallback !== undefined
          ? Effect.succeed(fallback)
          : Scope.extend(makeMemory(options), scope).pipe(
              withSql,
              Effect.mapError(
                (e) => new BillingUnavailable({ reason: `memory book: ${e.message}`, cause: e }),
              ),
              Effect.tap((book) => {
                fallback = book
              }),
            ),
      ),
    )

    const reserve = (input: ReserveInput) => withFallback(input, reserveShared(input))
    const withFallback = (
      input: ReserveInput,
      shared: Effect.Effect<Hold, ReserveRefusal | BillingUnavailable>,
    ) =>
      Effect.catchIf(
        shared,
        (e): e is BillingUnavailable =>
          e._tag === "BillingUnavailable" && options.onRedisFailure === "open" && redisDown(e),
        (e) =>
          Effect.gen(function* () {
            yield* warnOutage("holding money per instance (SWARMGATE_LIMITS_ON_REDIS_FAILURE=open)", e)
            const book = yield* memoryBook
            const hold = yield* book.reserve(input)
            fallbackHolds.add(hold.requestId)
            return hold
          }),
      )

    const applyReplayed = Effect.gen(function* () {
      while (replay.length > 0) {
        const next = replay[0]!
        yield* run(
          Scripts.apply,
          [K.account(next.accountId), K.key(next.keyId)],
          [next.charge, startOfUtcMonth(next.at), next.at],
        )
        replay.shift()
      }
    }).pipe(Effect.ignore)

    /**
     * Redis may blink; a charge is worth a few quick retries before it is left to the lease.
     * `first` is the first try (perhaps sent already), `again` each retry.
     */
    function* retriedBody<A>(
      first: Effect.Effect<A, R.RedisFailure>,
      again: Effect.Effect<A, R.RedisFailure>,
    ) {
      let last: R.RedisFailure | undefined
      for (let attempt = 1; attempt <= 3; attempt++) {
        const result = yield* Effect.either(attempt === 1 ? first : again)
        if (result._tag === "Right") return result.right
        last = result.left
        yield* sleepReal(50 * attempt)
      }
      return yield* Effect.fail(last!)
    }

    /** The settlement of a local hold: its usage record and the script's keys and arguments. */
    const settlementOf = (requestId: string, hold: Hold, settlement: Settlement, now: number) => {
      const cost = costMicros(priceOf(hold.model), hold.promptTokens, settlement.completionTokens)
      const chargedMicros = Math.max(0, Math.min(cost, hold.amountMicros))
      const entry = LedgerWriter.usageEntry(hold, settlement, chargedMicros, now)
      const keys = [K.holds, K.holdIndex, K.queue]
      const args = [base, requestId, entry.costMicros, startOfUtcMonth(now), JSON.stringify(entry)]
      return { entry, keys, args }
    }

    /**
     * Settlements whose script could not reach Redis, by request id, in the order they failed:
     * sent again every second until Redis answers. The hold keeps its money until it is charged
     * or lapses, so a late charge spends only what was held; the script resolves a request once,
     * so a reply lost on the way (the script ran) costs no second charge; and a hold that lapsed
     * meanwhile answers "resolved", uncharged, as before. Not with the `open` policy: its memory
     * book, seeded from the ledger, knows nothing of the holds in Redis and may have spent their
     * money meanwhile, so there they lapse uncharged.
     */
    const late = new Map<string, LateSettlement>()
    /** Those being sent now: a round running beside another (the shutdown's) skips them. */
    const sending = new Set<string>()
    // Open while settlements wait: the loop sleeps on it otherwise.
    const lateWaiting = yield* Effect.makeLatch(false)

    /** The charge's script (`first`, retried as `again`), then the writer told; the entry if it charged. */
    function* chargedBody(
      requestId: string,
      settlement: ReturnType<typeof settlementOf>,
      first: Effect.Effect<unknown, R.RedisFailure>,
      again: Effect.Effect<unknown, R.RedisFailure>,
    ) {
      const charged = yield* Effect.either(Effect.gen(() => retriedBody(first, again)))
      if (charged._tag === "Right") return afterCharge(settlement.entry, charged.right)
      if (late.size >= MAX_LATE_SETTLEMENTS || options.onRedisFailure === "open") {
        yield* Effect.logError(
          `billing: settling ${requestId} failed (${charged.left.reason}); its hold lapses within the lease, uncharged`,
        )
        return undefined
      }
      late.set(requestId, withSince(settlement, yield* Clock.currentTimeMillis))
      lateWaiting.unsafeOpen()
      yield* throttled(
        `billing: settling ${requestId} failed (${charged.left.reason}); it is sent again once Redis answers`,
      )
      return undefined
    }

    /**
     * One settlement sent again, claimed in `sending` by the caller: false while Redis is still
     * away. Whole, once begun (the shutdown waits for it).
     */
    const settleOneLate = (requestId: string, pending: LateSettlement) =>
      Effect.uninterruptible(
        Effect.gen(function* () {
          const reply = yield* Effect.either(run(Scripts.settle, pending.keys, pending.args))
          if (reply._tag === "Left") return false
          late.delete(requestId)
          if (afterCharge(pending.entry, reply.right) === undefined)
            yield* Effect.logWarning(
              `billing: ${requestId} was already resolved when Redis answered again (its hold lapsed, or an earlier try charged it and its reply was lost)`,
            )
          return true
        }).pipe(Effect.ensuring(Effect.sync(() => sending.delete(requestId)))),
      )

    /**
     * One round of the late settlements: the too old given up, then the rest in order until Redis
     * fails again (or, at shutdown, `until` passes).
     */
    const settleLate = (until = Number.POSITIVE_INFINITY) =>
      Effect.gen(function* () {
        if (late.size === 0) return
        const now = yield* Clock.currentTimeMillis
        let expired = 0
        for (const [requestId, pending] of late) {
          if (now - pending.since <= MAX_LATE_MILLIS || sending.has(requestId)) continue
          late.delete(requestId)
          expired++
        }
        if (expired > 0)
          yield* Effect.logError(
            `billing: ${expired} settlement(s) could not reach Redis for ${MAX_LATE_MILLIS / 60_000} minutes; their holds lapse, uncharged`,
          )
        for (const [requestId, pending] of [...late]) {
          if (Date.now() >= until) return
          if (sending.has(requestId) || !late.has(requestId)) continue
          // Claimed in the same step as the check: a round running beside this one skips it.
          sending.add(requestId)
          // Still away: the rest waits for the next round.
          if (!(yield* settleOneLate(requestId, pending))) return
        }
      })
    /** The settle script's reply: charged (the writer told), or not (resolved already, or expired). */
    const afterCharge = (entry: Ledger.UsageEntry, charged: unknown) => {
      if (Number(charged) !== 1) return undefined
      settledSinceWrite++
      wake.unsafeOpen()
      if (settledSinceWrite >= batchMax) full.unsafeOpen()
      return entry
    }

    /** A hold settled on the memory book of an outage (`open` policy): its charge replayed later. */
    const settleFallback = (requestId: string, settlement: Settlement, book: BillingShape) =>
      Effect.tap(book.settle(requestId, settlement), (entry) => {
        if (entry !== undefined && entry.costMicros > 0)
          replay.push({
            accountId: entry.accountId,
            keyId: entry.keyId,
            charge: entry.costMicros,
            at: entry.createdAt,
          })
      })

    function* settleBody(requestId: string, settlement: Settlement) {
      if (fallback !== undefined && fallbackHolds.delete(requestId))
        return yield* settleFallback(requestId, settlement, fallback)
      const hold = local.get(requestId)
      if (hold === undefined) return undefined
      local.delete(requestId)
      const settled = settlementOf(requestId, hold, settlement, yield* Clock.currentTimeMillis)
      const script = run(Scripts.settle, settled.keys, settled.args)
      return yield* chargedBody(requestId, settled, script, script)
    }
    const settle = (requestId: string, settlement: Settlement) =>
      Effect.uninterruptible(Effect.gen(() => settleBody(requestId, settlement)))

    /** `settle`, its script sent at the call (`now` from the caller's clock). */
    const settleSent = (
      requestId: string,
      settlement: Settlement,
      now: number,
    ): Effect.Effect<Ledger.UsageEntry | undefined> => {
      if (fallback !== undefined && fallbackHolds.has(requestId)) return settle(requestId, settlement)
      const hold = local.get(requestId)
      if (hold === undefined) return Effect.succeed(undefined)
      local.delete(requestId)
      const settled = settlementOf(requestId, hold, settlement, now)
      // The common answer in one step, read by callback where the caller can (`Observed`); a failure
      // goes through the retries.
      return Observed.uninterruptible(
        Observed.matchEffect(Observed.of(R.sendNow(redis, Scripts.settle, settled.keys, settled.args)), {
          onSuccess: (charged) => Exit.succeed(afterCharge(settled.entry, charged)),
          onFailure: (e) =>
            Effect.gen(() =>
              chargedBody(
                requestId,
                settled,
                Effect.fail(e),
                run(Scripts.settle, settled.keys, settled.args),
              ),
            ),
        }),
      )
    }

    const voided = (requestId: string, reply: Effect.Effect<unknown, R.RedisFailure>) =>
      Observed.catchAll(
        Observed.map(reply, (reply) => Number(reply) === 1),
        (e) =>
          Effect.as(
            Effect.logWarning(`billing: void of ${requestId} failed (${e.reason}); it lapses`),
            false,
          ),
      )
    const voidHold = (requestId: string) =>
      Effect.suspend(() => {
        if (fallback !== undefined && fallbackHolds.delete(requestId)) return fallback.void(requestId)
        if (!local.delete(requestId)) return Effect.succeed(false)
        return voided(requestId, run(Scripts.voidHold, [K.holds, K.holdIndex], [base, requestId]))
      })
    /** `void`, its script sent at the call. */
    const voidSent = (requestId: string): Effect.Effect<boolean> => {
      if (fallback !== undefined && fallbackHolds.has(requestId)) return voidHold(requestId)
      if (!local.delete(requestId)) return Effect.succeed(false)
      return voided(
        requestId,
        Observed.of(R.sendNow(redis, Scripts.voidHold, [K.holds, K.holdIndex], [base, requestId])),
      )
    }

    // Declared once per book, like `reserveAttemptBody`.
    function* holdSentBody(
      input: ReserveInput,
      sent: Effect.Effect<ReserveReply, BillingUnavailable>,
      now: number,
    ) {
      let first: Effect.Effect<ReserveReply, BillingUnavailable> | undefined = sent
      // The first try is the command sent already; a wait for other holds tries again as `reserve` does.
      const attempt = Effect.suspend(() => {
        const sentNow = first
        first = undefined
        return sentNow === undefined
          ? reserveAttempt(input)
          : Effect.gen(() => reserveAttemptBody(input, sentNow, now))
      })
      return yield* withFallback(input, reserveWaiting(input.waitMillis ?? 0, attempt, released))
    }

    const reserveSent = (input: ReserveInput, now: number): HoldSent => {
      // Placed, the hold is this instance's from its reply on (renewed, swept, resolvable), not from
      // when its owner waits for it: a request queued for a concurrency slot may wait past a lease.
      const raw = R.sendNow(
        redis,
        Scripts.reserve,
        reserveKeys(input),
        reserveArgs(input, now),
        couldNotHold,
        undefined,
        (reply) => {
          const result = reserveReply(reply)
          if (typeof result !== "string") placed(input, result, now)
        },
      )
      let started = false
      let firstFailed = false
      let resolved = false
      const resolveNow = (settlement: Settlement | undefined, at: number) =>
        settlement === undefined
          ? Observed.map(voidSent(input.requestId), () => undefined)
          : settleSent(input.requestId, settlement, at)
      // Observable: placed at the first try (the reply's handler put it in `local`) is an `Exit` read
      // by callback (one step on a fiber); anything else goes on as `reserve` does.
      const hold = Observed.uninterruptible(
        Observed.onExit(Observed.of(raw), (answer) => {
          started = true
          return Observed.matchEffect(answer, {
            onSuccess: (reply): Effect.Effect<Hold, ReserveRefusal | BillingUnavailable> => {
              const result = reserveReply(reply)
              if (typeof result === "string")
                return Effect.gen(() => holdSentBody(input, Effect.succeed(result), now))
              // Gone only if its lease lapsed meanwhile (swept): then a hold is placed afresh.
              const placedHold = local.get(input.requestId)
              return placedHold === undefined ? reserve(input) : Exit.succeed(placedHold)
            },
            onFailure: (e) => {
              firstFailed = true
              return Effect.gen(() => holdSentBody(input, Effect.fail(e), now))
            },
          })
        }),
      )
      return {
        hold,
        resolve: (settlement, at) => {
          if (resolved) return Effect.succeed(undefined)
          resolved = true
          // `hold` ran to its end (uninterruptible): what it placed is in `local` (or the fallback's).
          if (started && !firstFailed) return resolveNow(settlement, at)
          // Otherwise once the answer is in (not interruptible: the hold may be placed meanwhile).
          return Observed.uninterruptible(
            Observed.onExit(Observed.of(raw), (answer) => {
              const { requestId } = input
              if (Exit.isSuccess(answer) || local.has(requestId) || fallbackHolds.has(requestId))
                return resolveNow(settlement, at)
              // No answer (a timeout): the script may have run. Voiding what is not held changes nothing.
              // Sent, not waited for: a stalled Redis must not hold the request's error up another
              // command timeout (if it fails too, a placed hold lapses within its lease).
              R.sendNow(redis, Scripts.voidHold, [K.holds, K.holdIndex], [base, requestId])
              return Effect.succeed(undefined)
            }),
          )
        },
      }
    }

    const expire = Effect.flatMap(Clock.currentTimeMillis, (now) =>
      run(Scripts.expire, [K.holds, K.holdIndex], [base, now, EXPIRE_BATCH]).pipe(
        Effect.flatMap((reply) => {
          const ids = reply as ReadonlyArray<string>
          for (const id of ids) local.delete(id)
          return ids.length === 0
            ? Effect.succeed(0)
            : Effect.as(
                Effect.logWarning(
                  `billing: ${ids.length} hold(s) expired unsettled; their money is released`,
                ),
                ids.length,
              )
        }),
        Effect.catchAll((e) => Effect.as(throttled(`billing: hold sweep failed: ${e.reason}`), 0)),
        // Read at each sweep: the memory book of an outage exists only from the outage on.
        Effect.zipWith(
          Effect.suspend(() => (fallback === undefined ? Effect.succeed(0) : fallback.expire)),
          (a, b) => a + b,
        ),
      ),
    )

    const renew = Effect.gen(function* () {
      if (local.size === 0) return
      const until = (yield* Clock.currentTimeMillis) + leaseMillis
      for (const batch of chunks(local.keys(), RENEW_BATCH)) {
        const gone = (yield* run(
          Scripts.renew,
          [K.holds, K.holdIndex],
          [until, ...batch],
        )) as ReadonlyArray<string>
        for (const id of gone) local.delete(id)
      }
    }).pipe(Effect.catchAll((e) => throttled(`billing: renewing hold leases failed: ${e.reason}`)))

    // --- the ledger writer ----------------------------------------------------------------------

    /** Claims one batch, writes it, acknowledges it; returns how many were claimed. */
    const writeClaimed: Effect.Effect<number, BillingUnavailable> = Effect.uninterruptible(
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const raw = (yield* run(
          Scripts.claim,
          [K.queue, K.claimed, K.claimDeadlines],
          [now, now + claimMillis, batchMax],
        ).pipe(Effect.mapError(unavailable("could not claim charges")))) as ReadonlyArray<string>
        if (raw.length === 0) return 0
        const batch = raw.map((text) => JSON.parse(text) as Ledger.UsageEntry)
        const ack = (entries: ReadonlyArray<Ledger.UsageEntry>) =>
          entries.length === 0
            ? Effect.void
            : run(
                Scripts.ack,
                [K.claimed, K.claimDeadlines],
                entries.map((e) => e.requestId),
              ).pipe(
                // Unacknowledged, the claim runs out and the entries are written again: a no-op by request id.
                Effect.catchAll((e) =>
                  Effect.logWarning(`billing: acknowledging written charges failed: ${e.reason}`),
                ),
              )
        // An entry may be in the ledger already (written by a writer whose acknowledgement was lost).
        const outcome = yield* LedgerWriter.write(batch).pipe(withSql)
        yield* ack(outcome.written)
        if (outcome.failed.length > 0) {
          yield* run(
            Scripts.unclaim,
            [K.claimed, K.claimDeadlines, K.queue],
            outcome.failed.map((e) => e.requestId),
          ).pipe(Effect.ignore)
          return yield* Effect.fail(
            new BillingUnavailable({ reason: LedgerWriter.failedReason(outcome), cause: outcome.cause }),
          )
        }
        return batch.length
      }),
    )

    const flush: Effect.Effect<void, BillingUnavailable> = Effect.flatMap(writeClaimed, (n) =>
      n >= batchMax ? flush : Effect.void,
    )

    const writeNow = Effect.suspend(() => {
      wake.unsafeClose()
      full.unsafeClose()
      settledSinceWrite = 0
      return flush
    })

    const logWriteFailure = (e: BillingUnavailable) =>
      Effect.zipRight(
        redisDown(e)
          ? throttled(`billing: charges wait in Redis, which is unreachable: ${e.reason}`)
          : Effect.logError(`billing: ledger write failed, retrying: ${e.reason}`, e.cause),
        Effect.sleep(1_000),
      )

    yield* BackgroundLoop.fork(
      "ledger writer",
      Effect.gen(function* () {
        yield* wake.await
        yield* Effect.raceFirst(Effect.sleep(flushMillis), full.await)
        yield* writeNow.pipe(Effect.catchAll(logWriteFailure))
      }),
    )
    // Lapsed holds return their money every sweep, on a loop of their own: a ledger write that
    // is slow or stuck must not keep money held.
    yield* BackgroundLoop.fork("hold sweep", Effect.zipRight(Effect.sleep(sweepMillis), expire))
    // Writes what dead instances left queued or half-written.
    yield* BackgroundLoop.fork(
      "ledger catch-up",
      Effect.zipRight(Effect.sleep(sweepMillis), flush.pipe(Effect.catchAll(logWriteFailure))),
    )
    yield* BackgroundLoop.fork(
      "late settlements",
      Effect.gen(function* () {
        yield* lateWaiting.await
        yield* Effect.sleep(LATE_SETTLE_MILLIS)
        // Closed before the round: one added meanwhile opens it again.
        lateWaiting.unsafeClose()
        yield* settleLate()
        if (late.size > 0) lateWaiting.unsafeOpen()
      }),
    )
    yield* BackgroundLoop.fork(
      "hold renewal",
      Effect.gen(function* () {
        yield* Effect.sleep(Math.max(1, Math.floor(leaseMillis / 3)))
        yield* renew
        yield* applyReplayed
      }),
    )

    // Runs before the connection closes (finalizers run in reverse): requests interrupted by the
    // server closing settle within moments; wait briefly, return what is still held, write the rest.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        for (let waited = 0; local.size > 0 && waited < shutdownWaitMillis; waited += 20) yield* sleepReal(20)
        for (const id of local.keys()) yield* voidHold(id)
        yield* settleLate(Date.now() + SHUTDOWN_LATE_MILLIS)
        // A round of the loop may be sending one still (a send ends within two command timeouts).
        for (let waited = 0; sending.size > 0 && waited < 2 * commandTimeoutMillis + 500; waited += 20)
          yield* sleepReal(20)
        if (late.size > 0)
          yield* Effect.logError(
            `billing: ${late.size} settlement(s) could not reach Redis; their holds lapse within the lease, uncharged`,
          )
        let written = false
        for (let attempt = 0; attempt < 3 && !written; attempt++) {
          const result = yield* Effect.either(flush)
          written = result._tag === "Right"
          if (!written) {
            yield* Effect.logError(
              `billing: final ledger write failed: ${(result as { left: BillingUnavailable }).left.reason}`,
            )
            yield* sleepReal(200)
          }
        }
        yield* applyReplayed
        if (replay.length > 0)
          yield* Effect.logError(
            `billing: ${replay.length} charge(s) made while Redis was away are in the ledger but not in the shared book`,
          )
      }),
    )

    // --- the admin side -----------------------------------------------------------------------

    /** The ledger's figures, as the CLI shows them (no open holds): the admin API's view while Redis is away. */
    const ledgerMoney = (accountIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const movements = yield* readMovements(accountIds)
        const spent = new Map(
          (yield* Ledger.loadAccounts(accountIds, startOfUtcMonth(now))).map((a) => [
            a.id,
            a.spentMonthMicros,
          ]),
        )
        const result = new Map<string, AccountMoney>()
        for (const a of movements)
          result.set(a.id, {
            availableMicros: a.credits - a.charges,
            heldMicros: 0,
            spentMonthMicros: spent.get(a.id) ?? 0,
          })
        return result as ReadonlyMap<string, AccountMoney>
      }).pipe(withSql, Effect.mapError(unavailable("could not read balances")))

    const whileRedisDown =
      <A>(what: string, instead: Effect.Effect<A, BillingUnavailable>) =>
      (effect: Effect.Effect<A, BillingUnavailable>) =>
        Effect.catchIf(effect, redisDown, (e) => Effect.zipRight(warnOutage(what, e), instead))

    const sharedMoney = (accountIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        yield* ensure(accountIds, [])
        yield* refreshCredits(accountIds)
        const now = yield* Clock.currentTimeMillis
        const reply = (yield* run(Scripts.money, accountIds.map(K.account), [startOfUtcMonth(now)]).pipe(
          Effect.mapError(unavailable("could not read balances")),
        )) as ReadonlyArray<ReadonlyArray<string> | null>
        const result = new Map<string, AccountMoney>()
        accountIds.forEach((id, i) => {
          const row = reply[i]
          if (!row) return
          const [balance, held, spentMonth] = row.map(Number) as [number, number, number]
          result.set(id, { availableMicros: balance - held, heldMicros: held, spentMonthMicros: spentMonth })
        })
        return result as ReadonlyMap<string, AccountMoney>
      })

    const accountMoney = (accountIds: ReadonlyArray<string>) =>
      sharedMoney(accountIds).pipe(
        whileRedisDown(
          "account views show the ledger",
          Effect.suspend(() =>
            fallback !== undefined ? fallback.accountMoney(accountIds) : ledgerMoney(accountIds),
          ),
        ),
      )

    const sharedKeySpent = (keyIds: ReadonlyArray<string>) =>
      Effect.gen(function* () {
        yield* ensure([], keyIds)
        const spent = yield* R.command(() =>
          Promise.all(keyIds.map((id) => redis.hget(K.key(id), "spent"))),
        ).pipe(Effect.mapError(unavailable("could not read key spend")))
        const result = new Map<string, number>()
        keyIds.forEach((id, i) => {
          const value = spent[i]
          if (value !== null && value !== undefined) result.set(id, Number(value))
        })
        return result as ReadonlyMap<string, number>
      })

    const keySpent = (keyIds: ReadonlyArray<string>) =>
      sharedKeySpent(keyIds).pipe(
        whileRedisDown(
          "key views show the ledger",
          Effect.suspend(() =>
            fallback !== undefined
              ? fallback.keySpent(keyIds)
              : Ledger.loadKeys(keyIds).pipe(
                  withSql,
                  Effect.mapError(unavailable("could not read key spend")),
                ),
          ),
        ),
      )

    const service: BillingShape = {
      prices,
      holdAmount,
      reserve,
      settle,
      void: voidHold,
      reserveSent,
      expire,
      // A credit is in the ledger already; the book finds it on a later refresh if Redis is away now.
      refresh: (accountIds) =>
        refreshCredits(accountIds).pipe(
          whileRedisDown("new credits reach the shared book later", Effect.void),
          Effect.zipRight(fallback === undefined ? Effect.void : fallback.refresh(accountIds)),
        ),
      accountMoney,
      keySpent,
      // What Redis holds waits there while it is away; the memory book's charges are written regardless.
      flush: Effect.zipRight(
        Effect.suspend(() => (fallback === undefined ? Effect.void : fallback.flush)),
        flush.pipe(whileRedisDown("queued charges wait in Redis", Effect.void)),
      ),
      pending: Effect.map(
        Effect.either(R.command(() => Promise.all([redis.llen(K.queue), redis.hlen(K.claimed)]))),
        (counts) => ({
          holds: local.size + fallbackHolds.size,
          unwritten: counts._tag === "Right" ? counts.right[0] + counts.right[1] : 0,
        }),
      ),
    }
    return service
  })

/** The Redis-backed billing service over the `SqlClient` in context. */
export const layer = (
  options: RedisBillingOptions,
): Layer.Layer<Billing, SqlError.SqlError, SqlClient.SqlClient> => Layer.scoped(Billing, make(options))

/** Options from the environment (as `Billing.config`) plus where the book lives in Redis. */
export const layerConfig = (
  modelIds: ReadonlyArray<string>,
  redis: {
    readonly url: Redacted.Redacted
    readonly prefix: string
    readonly leaseMillis: number
    readonly onRedisFailure?: "closed" | "open" | undefined
  },
): Layer.Layer<Billing, SqlError.SqlError | ConfigError.ConfigError, SqlClient.SqlClient> =>
  Layer.scoped(
    Billing,
    Effect.flatMap(billingConfig(modelIds), (options) => make({ ...options, ...redis })),
  )
