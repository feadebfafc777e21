/**
 * Holds, settlement and spend for one gateway instance. Balances, open holds
 * and spend figures live in memory (checked and updated synchronously, so
 * concurrent requests cannot jointly overspend); the SQL ledger is the durable
 * truth. Settled charges are written in batches (group commit), never on the
 * request's critical path; the book is rebuilt from the ledger at start.
 *
 * A crash loses the open holds (nothing was charged for them: the money is
 * simply available again) and the charges not yet committed (under-charge,
 * never over-charge).
 */
import type { SqlClient, SqlError } from "@effect/sql"
import {
  AccountSpendLimitReached,
  BillingLimitExceeded,
  ConcurrencyLimitExceeded,
  InsufficientQuota,
  PaymentHold,
} from "@swarmgate/protocol"
import { Clock, Config, type ConfigError, Context, Data, Effect, Either, Layer, type Scope } from "effect"
import * as BackgroundLoop from "./internal/BackgroundLoop"
import {
  Book,
  HELD_BY_OTHERS,
  type Hold,
  type HoldRequest,
  type Refusal,
  type Shortfall,
  startOfUtcMonth,
} from "./internal/Book"
import * as LedgerWriter from "./internal/LedgerWriter"
import * as Ledger from "./Ledger"
import { costMicros, fromConfig, type PriceTable } from "./Prices"

export type { Hold } from "./internal/Book"
export type { UsageOutcome } from "./Ledger"

/** A No code (the limit cannot pay even the minimum), or 429 after waiting in vain for other holds. */
export type ReserveRefusal =
  | InsufficientQuota
  | PaymentHold
  | AccountSpendLimitReached
  | BillingLimitExceeded
  | ConcurrencyLimitExceeded

/** The ledger could not be read or written; the gateway answers 503 for a reservation that needs it. */
export class BillingUnavailable extends Data.TaggedError("BillingUnavailable")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

export interface ReserveInput extends HoldRequest {
  /**
   * The request's completion cap: the hold prices promptTokens + maxTokens,
   * or, when the limits leave less, all that is left and the cap it buys
   * (`Hold.maxTokens`).
   */
  readonly maxTokens: number
  /** An unsettled hold expires (and its money returns) this long after it was placed. */
  readonly ttlMillis: number
  /**
   * How long to wait for the account's other holds to settle when only they
   * stand in the way (the account queue's wait); then 429
   * `concurrency_limit_exceeded`. 0 or absent: no wait.
   */
  readonly waitMillis?: number | undefined
}

export interface Settlement {
  readonly completionTokens: number
  readonly outcome: Ledger.UsageOutcome
}

export interface AccountMoney {
  /** Credits − charges − open holds: what new requests may still hold. */
  readonly availableMicros: number
  readonly heldMicros: number
  readonly spentMonthMicros: number
}

/**
 * A hold sent at once (`reserveSent`): the book's command left at the call;
 * the hold, and its resolution the caller owes.
 */
export interface HoldSent {
  /**
   * Waits for the book's answer and finishes the hold as `reserve` does (a
   * book seeded first, a balance re-read, a wait for other holds);
   * uninterruptible. Observable (`Observed`): read by plain calls, it gives
   * the hold as an `Exit` where it was placed at the first try, else the
   * Effect that goes on (the same steps as ever). Run or read it once, not
   * both.
   */
  readonly hold: Effect.Effect<Hold, ReserveRefusal | BillingUnavailable>
  /**
   * Settles what ran (as `settle`) — or voids the hold, with no settlement —
   * exactly once; nothing when no hold was placed. Sent at the call once the
   * hold is known (else after its answer), `now` from the caller's clock;
   * returns the Effect that waits for the book — observable (`Observed`)
   * where that is the book's reply (not a hold the fallback book placed):
   * a plain close reads it by callback.
   */
  readonly resolve: (
    settlement: Settlement | undefined,
    now: number,
  ) => Effect.Effect<Ledger.UsageEntry | undefined>
}

export interface BillingShape {
  readonly prices: PriceTable
  /** The worst-case cost of a request: its prompt plus its whole completion cap. */
  readonly holdAmount: (model: string, promptTokens: number, maxTokens: number) => number
  /**
   * Places a hold (possibly with a smaller completion cap), waiting up to
   * `waitMillis` for other holds to settle; or refuses with the wire error of
   * the first limit that cannot pay the minimum.
   */
  readonly reserve: (input: ReserveInput) => Effect.Effect<Hold, ReserveRefusal | BillingUnavailable>
  /**
   * Charges what ran (capped at the hold) and queues its usage record. Exactly
   * once per request id: later calls, or a call after void/expiry, do nothing
   * and return undefined. Uninterruptible; never touches the disk.
   */
  readonly settle: (requestId: string, settlement: Settlement) => Effect.Effect<Ledger.UsageEntry | undefined>
  /** Drops the hold without a charge or a record (refused before generation). */
  readonly void: (requestId: string) => Effect.Effect<boolean>
  /**
   * `reserve` as one plain call where the book can decide at once (in memory,
   * account and key loaded, no balance re-read due); `undefined` when only
   * `reserve` can decide. Absent on books that never decide synchronously.
   */
  readonly reserveNow?:
    | ((input: ReserveInput, now: number) => Either.Either<Hold, ReserveRefusal> | undefined)
    | undefined
  /** `settle` as one plain call (`now` from the caller's clock). */
  readonly settleNow?:
    | ((requestId: string, settlement: Settlement, now: number) => Ledger.UsageEntry | undefined)
    | undefined
  /** `void` as one plain call. */
  readonly voidNow?: ((requestId: string) => boolean) | undefined
  /**
   * `reserve` for a remote book (Redis): its command leaves at the call, in
   * the same write as whatever else the caller sends in this synchronous run
   * (the request's admission), and the caller runs the wait; the caller then
   * calls `resolve` exactly once, whatever happens. `now` from the caller's
   * clock. Absent on books that decide in memory.
   */
  readonly reserveSent?: ((input: ReserveInput, now: number) => HoldSent) | undefined
  /** Voids the holds past their expiry now (also done every `sweepMillis`); returns how many. */
  readonly expire: Effect.Effect<number>
  /** Re-reads committed balances after credits made elsewhere (admin API, CLI). */
  readonly refresh: (accountIds: ReadonlyArray<string>) => Effect.Effect<void, BillingUnavailable>
  readonly accountMoney: (
    accountIds: ReadonlyArray<string>,
  ) => Effect.Effect<ReadonlyMap<string, AccountMoney>, BillingUnavailable>
  /** All-time spend per key, charges not yet written included. */
  readonly keySpent: (
    keyIds: ReadonlyArray<string>,
  ) => Effect.Effect<ReadonlyMap<string, number>, BillingUnavailable>
  /** Writes every queued charge now. */
  readonly flush: Effect.Effect<void, BillingUnavailable>
  /** Open holds and queued charges, for tests and operators. */
  readonly pending: Effect.Effect<{ readonly holds: number; readonly unwritten: number }>
}

export class Billing extends Context.Tag("@swarmgate/billing/Billing")<Billing, BillingShape>() {}

export interface BillingOptions {
  readonly prices: PriceTable
  /** Longest wait before a settled charge is written (group-commit window). */
  readonly flushMillis?: number | undefined
  /** A batch this large is written at once. */
  readonly batchMax?: number | undefined
  /** Least time between two balance reads triggered by refusals of the same account. */
  readonly refreshMillis?: number | undefined
  /** How often expired holds are swept. */
  readonly sweepMillis?: number | undefined
  /** At shutdown, how long to wait for open holds to settle before the last write. */
  readonly shutdownWaitMillis?: number | undefined
}

export const defaults = {
  flushMillis: 50,
  batchMax: 500,
  refreshMillis: 1_000,
  sweepMillis: 5_000,
  shutdownWaitMillis: 2_000,
}

/** The wire error of a refusal by the book (memory or Redis). */
export const refusalError = (refusal: Refusal): ReserveRefusal => {
  switch (refusal) {
    case "insufficient_balance":
      return new InsufficientQuota({
        message:
          "The account balance cannot pay for this request's prompt and one completion token. Add credit or shorten the prompt.",
      })
    case "payment_hold":
      return new PaymentHold({
        message: "The usable balance is spent and the remaining credit is on hold after a payment dispute.",
      })
    case "account_spend_limit":
      return new AccountSpendLimitReached({
        message:
          "The account's monthly spend limit is reached: what is left cannot pay for this request's prompt and one completion token.",
      })
    case "key_spend_limit":
      return new BillingLimitExceeded({
        message:
          "This key's spend limit is reached: what is left cannot pay for this request's prompt and one completion token.",
      })
  }
}

/** Seconds a client should wait when other running requests hold the money this one needs. */
export const HELD_RETRY_AFTER_SECONDS = 1

/** The 429 of a request whose wait for the account's other holds ran out. */
export const heldByOthersError = (): ConcurrencyLimitExceeded =>
  new ConcurrencyLimitExceeded({
    message:
      "The account's other running requests hold the money this request needs; retry when they have finished.",
    retryAfterSeconds: HELD_RETRY_AFTER_SECONDS,
  })

/** A shortfall that is final now: a refusal, or `held_by_others` with no wait left. */
export const shortfallError = (shortfall: Shortfall): ReserveRefusal =>
  shortfall === HELD_BY_OTHERS ? heldByOthersError() : refusalError(shortfall)

/**
 * Places a hold with `attempt`, waiting (through `released`, which completes
 * when a hold of the account may have been released, or after its timeout)
 * while only other holds stand in the way, up to `waitMillis`.
 */
export const reserveWaiting = <E, R>(
  waitMillis: number,
  attempt: Effect.Effect<Hold | Shortfall, E, R>,
  released: (millis: number) => Effect.Effect<void, never, R>,
): Effect.Effect<Hold, ReserveRefusal | E, R> =>
  Effect.flatMap(Clock.currentTimeMillis, (start) => {
    const loop: Effect.Effect<Hold, ReserveRefusal | E, R> = Effect.flatMap(attempt, (result) => {
      if (typeof result !== "string") return Effect.succeed(result)
      if (result !== HELD_BY_OTHERS) return Effect.fail(refusalError(result))
      return Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const left = start + waitMillis - now
        return left <= 0 ? Effect.fail(heldByOthersError()) : Effect.zipRight(released(left), loop)
      })
    })
    return loop
  })

const unavailable = (reason: string) => (cause: SqlError.SqlError) =>
  new BillingUnavailable({ reason, cause })

/** Pure timer, not the Effect clock: shutdown waits in real time even under TestClock. */
const sleepReal = (millis: number) => Effect.promise(() => new Promise((r) => setTimeout(r, millis)))

export const make = (
  options: BillingOptions,
): Effect.Effect<BillingShape, SqlError.SqlError, SqlClient.SqlClient | Scope.Scope> =>
  Effect.gen(function* () {
    const withSql = yield* LedgerWriter.captureSql
    const flushMillis = options.flushMillis ?? defaults.flushMillis
    const batchMax = options.batchMax ?? defaults.batchMax
    const refreshMillis = options.refreshMillis ?? defaults.refreshMillis
    const sweepMillis = options.sweepMillis ?? defaults.sweepMillis
    const shutdownWaitMillis = options.shutdownWaitMillis ?? defaults.shutdownWaitMillis
    const prices = options.prices
    const book = new Book()
    // One writer or balance reader at a time: a balance read never overlaps a commit,
    // so `SQL balance − unwritten` is exact.
    const lock = yield* Effect.makeSemaphore(1)
    const queue: Array<Ledger.UsageEntry> = []
    const wake = yield* Effect.makeLatch(false)
    const full = yield* Effect.makeLatch(false)

    const priceOf = (model: string) => {
      const price = prices.get(model)
      if (price === undefined) throw new Error(`no price for model ${model}`)
      return price
    }

    const install = (
      accounts: ReadonlyArray<Ledger.LoadedAccount>,
      keys: ReadonlyMap<string, number>,
      now: number,
    ) => {
      for (const a of accounts) book.addAccount(a.id, a.balanceMicros, a.spentMonthMicros, now)
      for (const [id, spent] of keys) book.addKey(id, spent)
    }

    // Rebuild from the ledger.
    yield* Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const accounts = yield* Ledger.loadAccounts("all", startOfUtcMonth(now))
      const keys = yield* Ledger.loadKeys("all")
      install(accounts, keys, now)
    }).pipe(withSql)

    /** Loads what the book lacks; under the lock, so a load never races a commit or another load. */
    const ensure = (accountIds: ReadonlyArray<string>, keyIds: ReadonlyArray<string>) => {
      const missingAccounts = () => accountIds.filter((id) => !book.accounts.has(id))
      const missingKeys = () => keyIds.filter((id) => !book.keys.has(id))
      if (missingAccounts().length === 0 && missingKeys().length === 0) return Effect.void
      return lock.withPermits(1)(
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const accounts = missingAccounts()
          const keys = missingKeys()
          const loadedAccounts =
            accounts.length > 0 ? yield* Ledger.loadAccounts(accounts, startOfUtcMonth(now)) : []
          const loadedKeys = keys.length > 0 ? yield* Ledger.loadKeys(keys) : new Map<string, number>()
          install(loadedAccounts, loadedKeys, now)
        }).pipe(withSql, Effect.mapError(unavailable("could not load balances"))),
      )
    }

    const refreshNow = (accountIds: ReadonlyArray<string>) =>
      lock.withPermits(1)(
        Effect.gen(function* () {
          const balances = yield* Ledger.readBalances(accountIds)
          const now = yield* Clock.currentTimeMillis
          for (const [id, balance] of balances) {
            book.refresh(id, balance, now)
            wakeAccount(id)
          }
        }).pipe(withSql, Effect.mapError(unavailable("could not read balances"))),
      )

    const holdAmount = (model: string, promptTokens: number, maxTokens: number) =>
      costMicros(priceOf(model), promptTokens, maxTokens)

    // Requests waiting for a hold of their account to be released.
    const waiters = new Map<string, Set<() => void>>()
    const wakeAccount = (accountId: string) => {
      const set = waiters.get(accountId)
      if (set === undefined) return
      waiters.delete(accountId)
      for (const wake of set) wake()
    }
    book.onRelease = wakeAccount
    const released = (accountId: string) => (millis: number) =>
      Effect.timeoutOption(
        Effect.async<void>((resume) => {
          const wake = () => resume(Effect.void)
          const set = waiters.get(accountId) ?? new Set<() => void>()
          waiters.set(accountId, set)
          set.add(wake)
          return Effect.sync(() => {
            waiters.get(accountId)?.delete(wake)
          })
        }),
        millis,
      )

    const priceOfInput = (input: ReserveInput) => priceOf(input.model)

    /** One try: the book's answer, after a balance re-read when a refusal might be lifted by new credit. */
    const reserveOnce = (input: ReserveInput) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const price = priceOfInput(input)
        let result = book.reserve(input, price, input.maxTokens, now, input.ttlMillis)
        if (result === "insufficient_balance" || result === "payment_hold") {
          // Credit may have arrived from another process (the CLI): look once, at most every refreshMillis.
          const account = book.accounts.get(input.accountId)!
          if (now - account.checkedAt >= refreshMillis) {
            account.checkedAt = now
            yield* refreshNow([input.accountId])
            result = book.reserve(
              input,
              price,
              input.maxTokens,
              yield* Clock.currentTimeMillis,
              input.ttlMillis,
            )
          }
        }
        return result
      })

    const reserve = (input: ReserveInput) =>
      Effect.zipRight(
        ensure([input.accountId], [input.keyId]),
        reserveWaiting(input.waitMillis ?? 0, reserveOnce(input), released(input.accountId)),
      )

    const reserveNow = (
      input: ReserveInput,
      now: number,
    ): Either.Either<Hold, ReserveRefusal> | undefined => {
      const account = book.accounts.get(input.accountId)
      if (account === undefined || !book.keys.has(input.keyId)) return undefined
      const result = book.reserve(input, priceOfInput(input), input.maxTokens, now, input.ttlMillis)
      if (typeof result !== "string") return Either.right(result)
      // A wait, or a refusal that a balance re-read might lift, goes the Effect way.
      if (result === HELD_BY_OTHERS)
        return (input.waitMillis ?? 0) > 0 ? undefined : Either.left(heldByOthersError())
      if (
        (result === "insufficient_balance" || result === "payment_hold") &&
        now - account.checkedAt >= refreshMillis
      )
        return undefined
      return Either.left(refusalError(result))
    }

    const settleNow = (
      requestId: string,
      settlement: Settlement,
      now: number,
    ): Ledger.UsageEntry | undefined => {
      const hold = book.holds.get(requestId)
      if (hold === undefined) return undefined
      const cost = costMicros(priceOf(hold.model), hold.promptTokens, settlement.completionTokens)
      const charge = book.settle(requestId, cost, now)!
      const entry = LedgerWriter.usageEntry(hold, settlement, charge.chargedMicros, now)
      enqueue(entry)
      return entry
    }

    const enqueue = (entry: Ledger.UsageEntry) => {
      queue.push(entry)
      if (queue.length === 1) wake.unsafeOpen()
      if (queue.length >= batchMax) full.unsafeOpen()
    }

    const settle = (requestId: string, settlement: Settlement) =>
      Effect.map(Clock.currentTimeMillis, (now) => settleNow(requestId, settlement, now))

    const voidHold = (requestId: string) => Effect.sync(() => book.void(requestId) !== undefined)

    const expire = Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.suspend(() => {
        const expired = book.expire(now)
        return expired.length === 0
          ? Effect.succeed(0)
          : Effect.as(
              Effect.logWarning(
                `billing: ${expired.length} hold(s) expired unsettled; their money is released`,
              ),
              expired.length,
            )
      }),
    )

    /** Writes what is queued (up to batchMax); what failed goes back to the front of the queue. */
    const writeQueued = Effect.uninterruptible(
      lock.withPermits(1)(
        Effect.gen(function* () {
          wake.unsafeClose()
          full.unsafeClose()
          const batch = queue.splice(0, batchMax)
          if (queue.length > 0) wake.unsafeOpen()
          if (queue.length >= batchMax) full.unsafeOpen()
          if (batch.length === 0) return
          const outcome = yield* LedgerWriter.write(batch)
          for (const e of outcome.written) book.written(e.accountId, e.costMicros)
          if (outcome.failed.length > 0) {
            queue.unshift(...outcome.failed)
            wake.unsafeOpen()
            return yield* Effect.fail(
              new BillingUnavailable({ reason: LedgerWriter.failedReason(outcome), cause: outcome.cause }),
            )
          }
        }).pipe(withSql),
      ),
    )

    const flush: Effect.Effect<void, BillingUnavailable> = Effect.suspend(() =>
      queue.length === 0 ? Effect.void : Effect.zipRight(writeQueued, flush),
    )

    yield* BackgroundLoop.fork(
      "ledger writer",
      Effect.gen(function* () {
        yield* wake.await
        yield* Effect.raceFirst(Effect.sleep(flushMillis), full.await)
        yield* writeQueued.pipe(
          Effect.catchAll((e) =>
            Effect.zipRight(
              Effect.logError(`billing: ledger write failed, retrying: ${e.reason}`, e.cause),
              Effect.sleep(1_000),
            ),
          ),
        )
      }),
    )
    yield* BackgroundLoop.fork("hold sweep", Effect.zipRight(Effect.sleep(sweepMillis), expire))

    // Runs first at shutdown: requests interrupted by the server closing settle within moments;
    // wait for them briefly, then write everything.
    yield* Effect.addFinalizer(() =>
      Effect.gen(function* () {
        for (let waited = 0; book.holds.size > 0 && waited < shutdownWaitMillis; waited += 20)
          yield* sleepReal(20)
        for (let attempt = 0; attempt < 3 && queue.length > 0; attempt++) {
          const result = yield* Effect.either(flush)
          if (result._tag === "Left") {
            yield* Effect.logError(`billing: final ledger write failed: ${result.left.reason}`)
            yield* sleepReal(200)
          }
        }
        if (queue.length > 0) {
          yield* Effect.logError(`billing: ${queue.length} charge(s) were not written (under-charged)`)
        }
      }),
    )

    const money = (id: string, now: number): AccountMoney | undefined => {
      const account = book.account(id, now)
      if (account === undefined) return undefined
      return {
        availableMicros: account.balance - account.held,
        heldMicros: account.held,
        spentMonthMicros: account.spentMonth,
      }
    }

    const service: BillingShape = {
      prices,
      holdAmount,
      reserve,
      settle,
      void: voidHold,
      reserveNow,
      settleNow,
      voidNow: (requestId) => book.void(requestId) !== undefined,
      expire,
      refresh: (accountIds) => {
        const loaded = accountIds.filter((id) => book.accounts.has(id))
        return loaded.length === 0 ? Effect.void : refreshNow(loaded)
      },
      accountMoney: (accountIds) =>
        Effect.gen(function* () {
          const loaded = accountIds.filter((id) => book.accounts.has(id))
          yield* ensure(accountIds, [])
          if (loaded.length > 0) yield* refreshNow(loaded)
          const now = yield* Clock.currentTimeMillis
          const result = new Map<string, AccountMoney>()
          for (const id of accountIds) {
            const m = money(id, now)
            if (m !== undefined) result.set(id, m)
          }
          return result
        }),
      keySpent: (keyIds) =>
        Effect.map(ensure([], keyIds), () => {
          const result = new Map<string, number>()
          for (const id of keyIds) {
            const key = book.keys.get(id)
            if (key !== undefined) result.set(id, key.spent)
          }
          return result
        }),
      flush,
      pending: Effect.sync(() => ({ holds: book.holds.size, unwritten: queue.length })),
    }
    return service
  })

/** The billing service over the `SqlClient` in context. */
export const layer = (
  options: BillingOptions,
): Layer.Layer<Billing, SqlError.SqlError, SqlClient.SqlClient> => Layer.scoped(Billing, make(options))

/**
 * Options from the environment: prices (`SWARMGATE_PRICES` / `SWARMGATE_PRICES_FILE`)
 * for `modelIds`, and the group-commit window and batch size.
 */
export const config = (
  modelIds: ReadonlyArray<string>,
): Effect.Effect<BillingOptions, ConfigError.ConfigError> =>
  Effect.all({
    prices: fromConfig(modelIds),
    flushMillis: Config.integer("SWARMGATE_LEDGER_FLUSH_MS").pipe(
      Config.validate({ message: "must be 1-1000", validation: (n) => n >= 1 && n <= 1_000 }),
      Config.withDefault(defaults.flushMillis),
    ),
    batchMax: Config.integer("SWARMGATE_LEDGER_BATCH").pipe(
      Config.validate({ message: "must be 1-10000", validation: (n) => n >= 1 && n <= 10_000 }),
      Config.withDefault(defaults.batchMax),
    ),
  })

/** `layer` with options from `config`. */
export const layerConfig = (
  modelIds: ReadonlyArray<string>,
): Layer.Layer<Billing, SqlError.SqlError | ConfigError.ConfigError, SqlClient.SqlClient> =>
  Layer.scoped(Billing, Effect.flatMap(config(modelIds), make))
