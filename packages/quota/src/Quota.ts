/**
 * Admission: rate limits (GCRA) per subject and resource, calendar quotas and
 * concurrency with a bounded FIFO queue per subject, and a bound on requests in
 * flight per instance. A request is admitted into the caller's scope: its rate
 * and quota units are only reserved until `permit.commit` charges them, and
 * closing the scope releases the slot exactly once and drops reservations that
 * were never committed — so a request refused later leaves no trace.
 */
import {
  AdmissionUnavailable,
  ConcurrencyLimitExceeded,
  Observed,
  RateLimitExceeded,
} from "@swarmgate/protocol"
import { Clock, Context, Effect, Either, Exit, Fiber, Layer, Runtime, Scope } from "effect"
import {
  MICROS_PER_MILLI,
  MICROS_PER_SECOND,
  type QuotaPeriod,
  type RateState,
  rateParams,
} from "./internal/Algorithm"
import { type AdmitOutcome, type Normalized, type Store, StoreUnavailable } from "./internal/Store"
import * as MemoryStore from "./stores/Memory"
import * as RedisStore from "./stores/Redis"

// --- limits ------------------------------------------------------------------------

/** At most `limit` requests per `periodMillis` on average, `burst` (default: `limit`) at once after a quiet period. */
export interface RateLimit {
  readonly name: string
  readonly limit: number
  readonly periodMillis: number
  readonly burst?: number | undefined
}

/** At most `limit` requests per UTC calendar day, or per ISO week (from Monday 00:00 UTC). */
export interface CalendarQuota {
  readonly name: string
  readonly limit: number
  readonly period: QuotaPeriod
}

/** At most `limit` at once; up to `queue` more wait their turn in FIFO order, each for at most `maxWaitMillis`. */
export interface ConcurrencyLimit {
  readonly limit: number
  readonly queue?: number | undefined
  readonly maxWaitMillis?: number | undefined
}

/** An absent limit does not apply. */
export interface Limits {
  /** Per subject and resource. */
  readonly rates?: ReadonlyArray<RateLimit> | undefined
  /** Per subject. */
  readonly quotas?: ReadonlyArray<CalendarQuota> | undefined
  /** Per subject. */
  readonly concurrency?: ConcurrencyLimit | undefined
}

export interface AdmitRequest {
  /** Who is limited, e.g. an account id. */
  readonly subject: string
  /** What rate limits are counted per, e.g. a model id. */
  readonly resource?: string | undefined
  readonly limits: Limits
}

// --- results --------------------------------------------------------------------------

export interface RateStatus {
  readonly name: string
  readonly limit: number
  /** Requests that would be admitted now, one after the other. */
  readonly remaining: number
  /** Until the full burst is available again. */
  readonly resetMillis: number
}

export interface QuotaStatus {
  readonly name: string
  readonly limit: number
  readonly remaining: number
  /** Until the period ends and the quota starts afresh. */
  readonly resetMillis: number
}

export interface Permit {
  /** The rate limits after this admission (for `x-ratelimit-*` headers). */
  readonly rates: ReadonlyArray<RateStatus>
  /**
   * Charges the reserved rate and quota units: call it when the work really
   * starts. Idempotent; without it, closing the scope refunds everything.
   */
  readonly commit: Effect.Effect<void>
  /** `commit` by a plain call, where the permit was decided in memory (`admitNow`). */
  readonly commitNow?: (() => void) | undefined
  readonly isCommitted: Effect.Effect<boolean>
}

export type Refusal = RateLimitExceeded | ConcurrencyLimitExceeded

/** A permit held by plain calls (see `admitNow`). */
export interface PermitNow {
  /** The rate limits after this admission (for `x-ratelimit-*` headers). */
  readonly rates: ReadonlyArray<RateStatus>
  /** Charges the reserved rate and quota units; idempotent. */
  readonly commit: () => void
  readonly committed: () => boolean
  /** Frees the slot and refunds what was not committed. Once; later calls do nothing. */
  readonly release: () => void
}

export type AdmissionNow =
  | { readonly _tag: "Admitted"; readonly permit: PermitNow }
  | {
      readonly _tag: "Refused"
      readonly error: Refusal | AdmissionUnavailable
      readonly rates: ReadonlyArray<RateStatus>
    }
  /** Not decidable synchronously (the request would wait for a slot, or the store is remote): nothing changed; use `admit`. */
  | { readonly _tag: "Async" }

export type Admission =
  | { readonly _tag: "Admitted"; readonly permit: Permit }
  | { readonly _tag: "Refused"; readonly error: Refusal; readonly rates: ReadonlyArray<RateStatus> }

/**
 * An admission sent at once (`admitSent`): the store's command left at the
 * call; the decision, and the release the caller owes.
 */
export interface AdmissionSent {
  /**
   * Waits for the store's decision and finishes the admission as `admit`
   * does (a queue wait, the lease). Observable (`Observed`): read by plain
   * calls, it gives the admission as an `Exit` where it came at once
   * (admitted), else the Effect that goes on (a refusal, a queue, a
   * failure: the same steps as ever). Run or read it once, not both.
   */
  readonly admission: Effect.Effect<Admission, AdmissionUnavailable>
  /** Whether the permit's units are committed (charged). */
  readonly committed: () => boolean
  /**
   * Frees what the admission took, exactly once (later calls do nothing) —
   * with `commit`, charging a permit that nothing committed yet (its work
   * started). Sent at the call once the decision is known (else after it);
   * returns the Effect that waits for the store — observable (`Observed`)
   * where the store's reply is: a plain close reads it by callback.
   */
  readonly release: (commit: boolean) => Effect.Effect<void>
}

export interface Usage {
  readonly concurrency: number
  readonly queued: number
  /** By resource. */
  readonly rates: ReadonlyMap<string, ReadonlyArray<RateStatus>>
  readonly quotas: ReadonlyArray<QuotaStatus>
}

export interface QuotaShape {
  /**
   * Admits into the caller's scope, or refuses (leaving no trace). Fails with
   * 503 `admission_unavailable` when the instance is at its in-flight bound or
   * the store cannot answer (unless the failure policy is `open`).
   */
  readonly admit: (request: AdmitRequest) => Effect.Effect<Admission, AdmissionUnavailable, Scope.Scope>
  /**
   * `admit` as one plain call, for stores that decide synchronously (memory):
   * no scope, no fiber work; the caller calls `release` exactly once. `Async`
   * when only `admit` can decide (a queue wait, a remote store). `clock` is
   * the caller's fiber's (so `TestClock` drives it as it drives `admit`).
   */
  readonly admitNow: (request: AdmitRequest, clock: Clock.Clock) => AdmissionNow
  /**
   * `admit` for a store that can send at the call (Redis): the admission's
   * command leaves now, in the same write as whatever else the caller sends
   * in this synchronous run (the request's hold), and the caller runs the
   * wait. No scope: the caller calls `release` exactly once, whatever happens
   * — even when it never runs the wait. `clock` is the caller's fiber's.
   * Absent on stores that cannot.
   */
  readonly admitSent?: ((request: AdmitRequest, clock: Clock.Clock) => AdmissionSent) | undefined
  /** The current state of `request`'s limits; rates are read for each of `resources`. */
  readonly usage: (
    request: AdmitRequest,
    resources?: ReadonlyArray<string>,
  ) => Effect.Effect<Usage, AdmissionUnavailable>
  /** Requests admitted (or queued) by this instance and not yet released. */
  readonly inFlight: Effect.Effect<number>
}

export class Quota extends Context.Tag("@swarmgate/quota/Quota")<Quota, QuotaShape>() {}

/** Admits or fails with the refusal: what most callers want. */
export const admit = (
  request: AdmitRequest,
): Effect.Effect<Permit, Refusal | AdmissionUnavailable, Quota | Scope.Scope> =>
  Effect.flatMap(Quota, (quota) => quota.admit(request)).pipe(
    Effect.flatMap((admission) =>
      admission._tag === "Admitted" ? Effect.succeed(admission.permit) : Effect.fail(admission.error),
    ),
  )

// --- options --------------------------------------------------------------------------

export interface QuotaOptions {
  /** Requests admitted or queued at once on this instance; beyond it 503 `admission_unavailable`. */
  readonly maxInFlight?: number | undefined
  /** Queue wait when the request does not say (`ConcurrencyLimit.maxWaitMillis`). */
  readonly maxQueueWaitMillis?: number | undefined
  /**
   * When the store cannot answer: `closed` refuses with 503 `admission_unavailable`
   * (the default), `open` admits without limits until the store is back.
   */
  readonly onStoreFailure?: "closed" | "open" | undefined
}

export const DEFAULT_MAX_QUEUE_WAIT_MILLIS = 10_000

// --- the service --------------------------------------------------------------------

const toMillis = (micros: number) => Math.max(0, Math.ceil(micros / MICROS_PER_MILLI))

const rateStatus = (state: RateState): RateStatus => ({
  name: state.name,
  limit: state.limit,
  remaining: state.remaining,
  resetMillis: toMillis(state.resetMicros),
})

const isCount = (n: unknown): n is number => typeof n === "number" && Number.isSafeInteger(n) && n >= 0

const invalid = (what: string): never => {
  throw new RangeError(`@swarmgate/quota: ${what}`)
}

/** Limits in store units; a malformed limit is a programming error (a defect), not a refusal. */
export const normalize = (request: AdmitRequest): Normalized => {
  if (typeof request.subject !== "string" || request.subject.length === 0)
    invalid("subject must be non-empty")
  const names = new Set<string>()
  const unique = (name: string) => {
    if (typeof name !== "string" || name.length === 0 || names.has(name))
      invalid(`duplicate or empty name '${name}'`)
    names.add(name)
  }
  const rates = (request.limits.rates ?? []).map((rate) => {
    unique(rate.name)
    if (!isCount(rate.limit)) invalid(`rate ${rate.name}: limit must be a non-negative integer`)
    if (!(rate.periodMillis > 0) || !Number.isFinite(rate.periodMillis))
      invalid(`rate ${rate.name}: periodMillis must be positive`)
    const burst = rate.burst ?? Math.max(1, rate.limit)
    if (!isCount(burst) || burst < 1) invalid(`rate ${rate.name}: burst must be a positive integer`)
    return rateParams(rate.name, rate.limit, rate.periodMillis, burst)
  })
  const quotas = (request.limits.quotas ?? []).map((quota) => {
    unique(quota.name)
    if (!isCount(quota.limit)) invalid(`quota ${quota.name}: limit must be a non-negative integer`)
    if (quota.period !== "day" && quota.period !== "week")
      invalid(`quota ${quota.name}: period must be day or week`)
    return { name: quota.name, limit: quota.limit, period: quota.period }
  })
  const concurrency = request.limits.concurrency
  if (concurrency !== undefined) {
    if (!isCount(concurrency.limit)) invalid("concurrency limit must be a non-negative integer")
    if (concurrency.queue !== undefined && !isCount(concurrency.queue))
      invalid("queue must be a non-negative integer")
  }
  return {
    subject: request.subject,
    resource: request.resource ?? "",
    rates,
    quotas,
    concurrency:
      concurrency === undefined ? undefined : { limit: concurrency.limit, queue: concurrency.queue ?? 0 },
  }
}

const retryAfterSeconds = (micros: number) => micros / MICROS_PER_SECOND

const rateRefusal = (request: Normalized, limit: string, waitMicros: number) =>
  new RateLimitExceeded({
    message: `Rate limit reached (${limit}${request.resource ? ` for ${request.resource}` : ""}); retry after the indicated delay.`,
    retryAfterSeconds: retryAfterSeconds(waitMicros),
  })

const concurrencyRefusal = (waitMicros: number) =>
  new ConcurrencyLimitExceeded({
    message: "Too many requests of this account are running at once; retry after the indicated delay.",
    retryAfterSeconds: retryAfterSeconds(waitMicros),
  })

const instanceFull = new AdmissionUnavailable({
  message: "This instance is at its limit of requests in flight; retry after the indicated delay.",
  retryAfterSeconds: 1,
})

const storeDown = new AdmissionUnavailable({
  message: "Admission is unavailable right now; retry after the indicated delay.",
  retryAfterSeconds: 2,
})

const openPermit: Permit = { rates: [], commit: Effect.void, isCommitted: Effect.succeed(false) }

// Unique across the instances sharing a store (~100 random bits drawn once per process, then a
// count), not secret: a string join per permit, not two random draws and a clock read.
const randomPart = () => Math.floor(Math.random() * 2 ** 52).toString(36)
const processPart = `${randomPart()}${randomPart()}`
let permitsMade = 0
const newPermitIdNow = () => `${processPart}.${(++permitsMade).toString(36)}`
const newPermitId = Effect.sync(newPermitIdNow)

/**
 * `normalize`, once per `Limits` object: callers that keep one limits object
 * per account (the gateway does) pay the validation once, not per request.
 */
const normalizedLimits = new WeakMap<Limits, Omit<Normalized, "subject" | "resource">>()

export const normalizeCached = (request: AdmitRequest): Normalized => {
  let limits = normalizedLimits.get(request.limits)
  if (limits === undefined) {
    const { subject: _s, resource: _r, ...rest } = normalize({ ...request, subject: "-" })
    limits = rest
    normalizedLimits.set(request.limits, limits)
  } else if (typeof request.subject !== "string" || request.subject.length === 0) {
    invalid("subject must be non-empty")
  }
  // Every field named: a copy by spread (`{ subject, resource, ...limits }`) cost ~40 ns against ~20
  // (docs/ARCHITECTURE.md, "Object spread").
  return {
    subject: request.subject,
    resource: request.resource ?? "",
    rates: limits.rates,
    quotas: limits.quotas,
    concurrency: limits.concurrency,
  }
}

/** A permit of the general path, as its release and its lease renewals read it. */
interface PermitState {
  done: boolean
  committed: boolean
  /** A deferred commit: when it was decided (ms), until a renewal or the release delivers it. */
  committedAt: number | undefined
  /** Its lease while the shared renewer keeps it (a remote store's permit). */
  lease: Lease | undefined
  /** Sent admissions (`admitSent`): the store's answer, once read. */
  answer?: Either.Either<AdmitOutcome, StoreUnavailable> | undefined
}

/** A running permit whose lease the store would let lapse unless renewed. */
interface Lease {
  readonly request: Normalized
  readonly permit: string
  readonly state: PermitState
  /** When it was admitted or last renewed (ms). */
  renewedAt: number
}

/** The deferred commit's age in µs, or undefined once delivered (or for a store that commits at once). */
const commitAgo = (state: PermitState, now: number) =>
  state.committedAt === undefined ? undefined : (now - state.committedAt) * MICROS_PER_MILLI

/** The service, and how to stop its lease renewer (a scoped layer does it when it closes). */
const build = (store: Store, options: QuotaOptions) =>
  Effect.map(Effect.runtime<never>(), (runtime) => {
    const maxInFlight = options.maxInFlight ?? Number.POSITIVE_INFINITY
    const defaultWait = options.maxQueueWaitMillis ?? DEFAULT_MAX_QUEUE_WAIT_MILLIS
    const failOpen = options.onStoreFailure === "open"
    let inFlight = 0
    let lastWarning = Number.NEGATIVE_INFINITY

    // One line per 10 s is enough to see an outage; one per request would drown the log.
    const warn = (what: string) => (error: StoreUnavailable) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (now - lastWarning < 10_000) return Effect.void
        lastWarning = now
        return Effect.logWarning(`quota store: ${what} failed (${error.reason})`)
      })

    // The leases of running permits (a remote store's), renewed together by one fiber that wakes every
    // quarter of a lease: not a fiber and a timer per request. A permit is renewed at most every quarter
    // and at least every 3/8 of a lease (plus a slow batch's wait), so one failed renewal still leaves
    // time for the next. It runs while any permit is leased, ends at the first wake that finds none
    // (steady traffic, even one request at a time, keeps one), and runs on the runtime the service was
    // made in (its logger and clock), not on the first request's fiber.
    const leaseMillis = store.leaseMillis
    const renewEvery = leaseMillis === undefined ? 0 : Math.max(1, Math.floor(leaseMillis / 4))
    const leases = new Set<Lease>()
    let renewer: Fiber.RuntimeFiber<void> | undefined
    const held = (state: PermitState) => () => !state.done
    // Checked and sent in one synchronous run of its fiber (and a NOSCRIPT retry only while still held):
    // nothing is renewed after its permit's release, which a late renewal would undo for a lease.
    const renewOne = (entry: Lease) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const { state, request, permit } = entry
        if (state.done) return Effect.void
        const ago = commitAgo(state, now)
        return Effect.tap(store.renew(request, permit, state.committed, ago, held(state)), () => {
          // Delivered: a renewal sent while this one ran carries it again, and the store ignores it.
          if (ago !== undefined) state.committedAt = undefined
        })
      }).pipe(
        Effect.catchAll(warn("renew")),
        // One permit's defect must not stop the others' renewals.
        Effect.catchAllDefect((defect) => Effect.logError("quota store: renewing a lease failed", defect)),
      )
    // Committed (and delivered) and without a slot, a permit holds nothing that could lapse.
    const needsRenewal = (entry: Lease) =>
      !entry.state.done &&
      (!entry.state.committed ||
        entry.state.committedAt !== undefined ||
        entry.request.concurrency !== undefined)
    function* renewLeasesBody() {
      while (true) {
        yield* Effect.sleep(renewEvery)
        if (leases.size === 0) {
          // Decided and cleared in one synchronous run: a lease added after this starts a new renewer.
          renewer = undefined
          return
        }
        const now = yield* Clock.currentTimeMillis
        const due: Array<Lease> = []
        for (const entry of leases)
          if (now - entry.renewedAt >= renewEvery / 2 && needsRenewal(entry)) {
            entry.renewedAt = now
            due.push(entry)
          }
        // All at once: one pipelined write to the store.
        if (due.length > 0) yield* Effect.forEach(due, renewOne, { concurrency: "unbounded", discard: true })
      }
    }
    // However it ends (idle, interrupted, a defect), the next lease starts another.
    const renewLeases = Effect.withFiberRuntime<void>((fiber) =>
      Effect.ensuring(
        Effect.gen(renewLeasesBody),
        Effect.sync(() => {
          if (renewer === fiber) renewer = undefined
        }),
      ),
    )
    const startRenewer = () => {
      if (renewer === undefined) renewer = Runtime.runFork(runtime)(renewLeases)
    }
    const unlease = (state: PermitState) => {
      const entry = state.lease
      if (entry === undefined) return
      state.lease = undefined
      leases.delete(entry)
    }

    // Declared once per service, not made per request (gateway/HttpServer.ts says why).
    function* admitNormalizedBody(
      request: Normalized,
      maxWait: number,
      restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>,
    ) {
      if (inFlight >= maxInFlight) return yield* Effect.fail(instanceFull)
      inFlight++
      const permit = yield* newPermitId
      const state: PermitState = { done: false, committed: false, committedAt: undefined, lease: undefined }
      const finish = (stored: boolean) =>
        Effect.suspend(() => {
          if (state.done) return Effect.void
          state.done = true
          inFlight--
          unlease(state)
          if (!stored) return Effect.void
          return Effect.flatMap(Clock.currentTimeMillis, (now) =>
            store.release(request, permit, state.committed, commitAgo(state, now)),
          ).pipe(Effect.catchAll(warn("release")))
        })

      const first = yield* Effect.either(store.admit(request, permit))
      if (Either.isLeft(first)) {
        yield* warn("admit")(first.left)
        if (!failOpen) {
          yield* finish(false)
          return yield* Effect.fail(storeDown)
        }
        yield* Scope.addFinalizer(yield* Effect.scope, finish(false))
        return { _tag: "Admitted", permit: openPermit } satisfies Admission
      }
      const outcome = first.right
      const rates = outcome.rates.map(rateStatus)
      if (outcome._tag === "RateLimited" || outcome._tag === "ConcurrencyLimited") {
        yield* finish(false)
        const error =
          outcome._tag === "RateLimited"
            ? rateRefusal(request, outcome.limit, outcome.waitMicros)
            : concurrencyRefusal(outcome.waitMicros)
        return { _tag: "Refused", error, rates } satisfies Admission
      }
      // Scope.addFinalizer, not Effect.addFinalizer: no fiber-ref diff and patch per request.
      yield* Scope.addFinalizer(yield* Effect.scope, finish(true))

      if (outcome._tag === "Queued") {
        const waited = yield* Effect.either(restore(store.awaitSlot(request, permit, maxWait)))
        if (Either.isLeft(waited)) {
          yield* warn("queue")(waited.left)
          if (!failOpen) {
            yield* finish(true)
            return yield* Effect.fail(storeDown)
          }
        } else if (waited.right._tag === "TimedOut") {
          yield* finish(true)
          return {
            _tag: "Refused",
            error: concurrencyRefusal(waited.right.waitMicros),
            rates,
          } satisfies Admission
        }
      }

      if (leaseMillis !== undefined) {
        // The time first: between the check and the adding below nothing may yield (a release in
        // between would leave its lease behind).
        const now = yield* Clock.currentTimeMillis
        if (!state.done) {
          const entry: Lease = { request, permit, state, renewedAt: now }
          state.lease = entry
          leases.add(entry)
          startRenewer()
        }
      }
      const commit = Effect.suspend(() => {
        if (state.committed || state.done) return Effect.void
        const commitNow = store.commit
        if (commitNow === undefined) {
          // No round trip at the first token: the release (or the next renewal) carries the commit,
          // charged as of now.
          return Effect.map(Clock.currentTimeMillis, (now) => {
            if (state.committed || state.done) return
            state.committed = true
            state.committedAt = now
          })
        }
        // The flag and the store's commit together, whatever interrupts: the release trusts the
        // flag to say whether the store counted a commit (the memory store counts what is pending).
        state.committed = true
        return Effect.catchAll(commitNow(request, permit), warn("commit"))
      }).pipe(Effect.uninterruptible)
      return {
        _tag: "Admitted",
        permit: { rates, commit, isCommitted: Effect.sync(() => state.committed) },
      } satisfies Admission
    }
    const admitNormalized = (request: Normalized, maxWait: number) =>
      Effect.uninterruptibleMask((restore) =>
        Effect.gen(() => admitNormalizedBody(request, maxWait, restore)),
      )

    // --- admissions sent at the call (a remote store's `send`) ----------------------------------

    const sendNow = store.send !== undefined && store.commit === undefined ? store.send : undefined
    /** A deferred commit, decided by a plain call: the release (or the next renewal) delivers it. */
    const commitDeferred = (state: PermitState, now: number) => {
      if (state.committed || state.done) return
      state.committed = true
      state.committedAt = now
    }
    /**
     * The permit's end, its release sent at the call (once) as `answer` calls for it: waited for
     * when the store holds something; sent and not waited for when nobody knows (the store did not
     * answer: a stalled Redis must not hold the request's error up another command timeout).
     */
    const finishSent = (
      send: NonNullable<Store["send"]>,
      request: Normalized,
      permit: string,
      state: PermitState,
      answer: Either.Either<AdmitOutcome, StoreUnavailable>,
      now: number,
    ): Effect.Effect<void> => {
      if (state.done) return Effect.void
      state.done = true
      inFlight--
      unlease(state)
      if (!mayHold(answer)) return Effect.void
      const released = send.release(request, permit, state.committed, commitAgo(state, now))
      // Observable as the store's release is (a plain close reads it by callback).
      return holds(answer) ? Observed.catchAll(released, warn("release")) : Effect.void
    }
    /** The store holds a slot or reservations for the permit. */
    const holds = (answer: Either.Either<AdmitOutcome, StoreUnavailable>) =>
      Either.isRight(answer) && (answer.right._tag === "Admitted" || answer.right._tag === "Queued")
    /**
     * Worth a release: it holds, or nobody knows (a failure — the script may have run, a timed-out
     * reply — and releasing what is not held changes nothing).
     */
    const mayHold = (answer: Either.Either<AdmitOutcome, StoreUnavailable>) =>
      Either.isLeft(answer) || holds(answer)
    const unreadable = new StoreUnavailable({ reason: "the admission's reply could not be read" })

    // Declared once per service, like `admitNormalizedBody`.
    function* admissionSentBody(
      send: NonNullable<Store["send"]>,
      request: Normalized,
      permit: string,
      state: PermitState,
      reply: Effect.Effect<Either.Either<AdmitOutcome, StoreUnavailable>>,
      maxWait: number,
      clock: Clock.Clock,
      restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>,
    ) {
      const first = yield* reply
      state.answer = first
      if (Either.isLeft(first)) {
        yield* warn("admit")(first.left)
        if (!failOpen) {
          yield* finishSent(send, request, permit, state, first, clock.unsafeCurrentTimeMillis())
          return yield* Effect.fail(storeDown)
        }
        return { _tag: "Admitted", permit: openPermit } satisfies Admission
      }
      const outcome = first.right
      const rates = outcome.rates.map(rateStatus)
      if (outcome._tag === "RateLimited" || outcome._tag === "ConcurrencyLimited") {
        yield* finishSent(send, request, permit, state, first, clock.unsafeCurrentTimeMillis())
        const error =
          outcome._tag === "RateLimited"
            ? rateRefusal(request, outcome.limit, outcome.waitMicros)
            : concurrencyRefusal(outcome.waitMicros)
        return { _tag: "Refused", error, rates } satisfies Admission
      }
      if (outcome._tag === "Queued") {
        const waited = yield* Effect.either(restore(store.awaitSlot(request, permit, maxWait)))
        if (Either.isLeft(waited)) {
          yield* warn("queue")(waited.left)
          if (!failOpen) {
            yield* finishSent(send, request, permit, state, first, clock.unsafeCurrentTimeMillis())
            return yield* Effect.fail(storeDown)
          }
        } else if (waited.right._tag === "TimedOut") {
          yield* finishSent(send, request, permit, state, first, clock.unsafeCurrentTimeMillis())
          return {
            _tag: "Refused",
            error: concurrencyRefusal(waited.right.waitMicros),
            rates,
          } satisfies Admission
        }
      }
      return admittedSent(request, permit, state, rates, clock)
    }
    /** A sent admission's permit, once the store gave it a slot: leased, committed by a plain call. */
    const admittedSent = (
      request: Normalized,
      permit: string,
      state: PermitState,
      rates: ReadonlyArray<RateStatus>,
      clock: Clock.Clock,
    ): Admission => {
      // Leased once, whichever read of the admission came first (`observe`, `admission`).
      if (leaseMillis !== undefined && !state.done && state.lease === undefined) {
        const entry: Lease = { request, permit, state, renewedAt: clock.unsafeCurrentTimeMillis() }
        state.lease = entry
        leases.add(entry)
        startRenewer()
      }
      const commitNow = () => commitDeferred(state, clock.unsafeCurrentTimeMillis())
      const permitSent: Permit = {
        rates,
        commit: Effect.sync(commitNow),
        commitNow,
        isCommitted: Effect.sync(() => state.committed),
      }
      return { _tag: "Admitted", permit: permitSent }
    }

    const admitSent = (input: AdmitRequest, clock: Clock.Clock): AdmissionSent => {
      const send = sendNow!
      const request = normalizeCached(input)
      if (inFlight >= maxInFlight) {
        const full = Exit.fail(instanceFull)
        return {
          admission: full,
          committed: () => false,
          release: () => Effect.void,
        }
      }
      inFlight++
      const permit = newPermitIdNow()
      const state: PermitState = { done: false, committed: false, committedAt: undefined, lease: undefined }
      // Sent now; every read of `sent` sees the same answer.
      const sent = send.admit(request, permit)
      const maxWait = input.limits.concurrency?.maxWaitMillis ?? defaultWait
      const decide = (first: Either.Either<AdmitOutcome, StoreUnavailable>) =>
        Effect.uninterruptibleMask((restore) =>
          Effect.gen(() =>
            admissionSentBody(send, request, permit, state, Effect.succeed(first), maxWait, clock, restore),
          ),
        )
      // Admitted at once in one step; a refusal, a queue or a failure as `admit` goes on.
      // Observable: admitted at once is an `Exit` read by callback (one step on a fiber); a refusal,
      // a queue or a failure goes on as `admit` does. A throw here is a defect (`Observed.onExit`).
      const admission = Observed.matchEffect(Observed.of(sent), {
        onSuccess: (outcome) => {
          if (outcome._tag !== "Admitted") return decide(Either.right(outcome))
          state.answer = Either.right(outcome)
          return Exit.succeed(admittedSent(request, permit, state, outcome.rates.map(rateStatus), clock))
        },
        onFailure: (error) => decide(Either.left(error)),
      })
      return {
        admission,
        committed: () => state.committed,
        release: (commit) => {
          if (state.done) return Effect.void
          const release = (answer: Either.Either<AdmitOutcome, StoreUnavailable>) => {
            const now = clock.unsafeCurrentTimeMillis()
            if (commit && holds(answer)) commitDeferred(state, now)
            return finishSent(send, request, permit, state, answer, now)
          }
          if (state.answer !== undefined) return release(state.answer)
          // The answer was never read (the caller stopped before it): read it, then release — not
          // interruptibly, or the release would be lost.
          return Observed.uninterruptible(
            Observed.onExit(Observed.of(sent), (exit) =>
              release(Exit.isSuccess(exit) ? Either.right(exit.value) : Either.left(unreadable)),
            ),
          )
        },
      }
    }

    // Permit ids of the synchronous path: unique in this process, which is all a memory store needs.
    let permits = 0
    const storeNow = store.now

    const admitNow = (request: AdmitRequest, clock: Clock.Clock): AdmissionNow => {
      if (storeNow === undefined) return { _tag: "Async" }
      const normalized = normalizeCached(request)
      if (inFlight >= maxInFlight) return { _tag: "Refused", error: instanceFull, rates: [] }
      const permit = `p${++permits}`
      const now = clock.unsafeCurrentTimeMillis() * MICROS_PER_MILLI
      const outcome = storeNow.admit(normalized, permit, now)
      if (outcome === undefined) return { _tag: "Async" }
      const rates = outcome.rates.map(rateStatus)
      if (outcome._tag === "RateLimited")
        return { _tag: "Refused", error: rateRefusal(normalized, outcome.limit, outcome.waitMicros), rates }
      if (outcome._tag === "ConcurrencyLimited")
        return { _tag: "Refused", error: concurrencyRefusal(outcome.waitMicros), rates }
      inFlight++
      let committed = false
      let done = false
      return {
        _tag: "Admitted",
        permit: {
          rates,
          commit: () => {
            if (committed || done) return
            committed = true
            storeNow.commit(normalized, permit, clock.unsafeCurrentTimeMillis() * MICROS_PER_MILLI)
          },
          committed: () => committed,
          release: () => {
            if (done) return
            done = true
            inFlight--
            storeNow.release(
              normalized,
              permit,
              committed,
              clock.unsafeCurrentTimeMillis() * MICROS_PER_MILLI,
            )
          },
        },
      }
    }

    const service: QuotaShape = {
      admitNow,
      // A malformed limit throws in the thunk: a defect, as before.
      admit: (request) =>
        Effect.suspend(() =>
          admitNormalized(normalizeCached(request), request.limits.concurrency?.maxWaitMillis ?? defaultWait),
        ),
      usage: (request, resources) =>
        Effect.sync(() => normalize(request)).pipe(
          Effect.flatMap((normalized) => store.usage(normalized, resources ?? [normalized.resource])),
          Effect.map(
            (usage): Usage => ({
              concurrency: usage.concurrency,
              queued: usage.queued,
              rates: new Map(
                [...usage.rates].map(([resource, states]) => [resource, states.map(rateStatus)]),
              ),
              quotas: usage.quotas.map((q) => ({
                name: q.name,
                limit: q.limit,
                remaining: q.remaining,
                resetMillis: toMillis(q.resetMicros),
              })),
            }),
          ),
          Effect.catchTag("StoreUnavailable", () => Effect.fail(storeDown)),
        ),
      inFlight: Effect.sync(() => inFlight),
      admitSent: sendNow === undefined ? undefined : admitSent,
    }
    const stopRenewals = Effect.suspend(() =>
      renewer === undefined ? Effect.void : Fiber.interrupt(renewer),
    )
    return { service, stopRenewals }
  })

/** The service over `store`; its lease renewer (a remote store's) runs on the runtime it is made in. */
export const make = (store: Store, options: QuotaOptions = {}): Effect.Effect<QuotaShape> =>
  Effect.map(build(store, options), ({ service }) => service)

// --- layers --------------------------------------------------------------------------

export type MemoryOptions = QuotaOptions

/** State in this process: exact for one instance; driven by `Clock`, so `TestClock` controls it. */
export const layerMemory = (options: MemoryOptions = {}) =>
  Layer.effect(
    Quota,
    Effect.flatMap(MemoryStore.make(), (store) => make(store, options)),
  )

export interface RedisOptions extends QuotaOptions, RedisStore.RedisStoreOptions {}

/** State in Redis, shared by every instance that uses the same `url` and `prefix`. */
export const layerRedis = (options: RedisOptions) =>
  Layer.scoped(
    Quota,
    Effect.flatMap(RedisStore.make(options), (store) =>
      Effect.flatMap(build(store, options), ({ service, stopRenewals }) =>
        Effect.as(
          Effect.addFinalizer(() => stopRenewals),
          service,
        ),
      ),
    ),
  )
