/**
 * Limits on the request path: the account's limits (its own, or the configured
 * defaults) admitted through the quota service, the `x-ratelimit-*` headers,
 * and the commit when generation starts. Anything that ends the request before
 * then — billing, dispatch (429 `capacity_exhausted`, 502), a disconnect —
 * refunds the rate and quota units when the request's scope closes.
 */
import type { ServerResponse } from "node:http"
import type { Account, Principal } from "@swarmgate/auth"
import { Dispatcher, Finalizers } from "@swarmgate/dispatch"
import type { AdmissionUnavailable, ConcurrencyLimitExceeded, RateLimitExceeded } from "@swarmgate/protocol"
import { Quota } from "@swarmgate/quota"
import { Clock, Config, ConfigError, Context, Effect, Either, Layer, Option, Redacted, Scope } from "effect"
import type { Outcome } from "./ChatCompletions"

// --- configuration ----------------------------------------------------------------

/** `null` = no such limit. */
export interface LimitDefaults {
  readonly concurrency: number | null
  readonly queue: number | null
  readonly rpm: number | null
  readonly rph: number | null
  readonly daily: number | null
  readonly weekly: number | null
}

export interface LimitsConfigShape {
  /** For every limit an account leaves unset (`null`/absent). */
  readonly defaults: LimitDefaults
  /** How long a request may wait in its account's queue for a slot. */
  readonly queueWaitMillis: number
}

export class LimitsConfig extends Context.Tag("@swarmgate/gateway/LimitsConfig")<
  LimitsConfig,
  LimitsConfigShape
>() {}

export const defaults: LimitDefaults = {
  concurrency: 4,
  queue: 8,
  rpm: 60,
  rph: 1_000,
  daily: 10_000,
  weekly: 50_000,
}

export const DEFAULT_QUEUE_WAIT_MILLIS = 10_000
export const DEFAULT_MAX_IN_FLIGHT = 1_024

/** A count, or `none` for no limit. */
const limitConfig = (name: string, fallback: number | null) =>
  Config.string(name).pipe(
    Config.mapOrFail((raw) => {
      const text = raw.trim().toLowerCase()
      if (text === "none") return Either.right(null)
      const n = Number(text)
      return Number.isSafeInteger(n) && n >= 0 && text !== ""
        ? Either.right(n)
        : Either.left(ConfigError.InvalidData([name], `${name} must be a non-negative integer or "none"`))
    }),
    Config.withDefault(fallback),
  )

export const config = Config.all({
  defaults: Config.all({
    concurrency: limitConfig("SWARMGATE_DEFAULT_CONCURRENCY", defaults.concurrency),
    queue: limitConfig("SWARMGATE_DEFAULT_QUEUE", defaults.queue),
    rpm: limitConfig("SWARMGATE_DEFAULT_RPM", defaults.rpm),
    rph: limitConfig("SWARMGATE_DEFAULT_RPH", defaults.rph),
    daily: limitConfig("SWARMGATE_DEFAULT_DAILY", defaults.daily),
    weekly: limitConfig("SWARMGATE_DEFAULT_WEEKLY", defaults.weekly),
  }),
  queueWaitMillis: Config.integer("SWARMGATE_QUEUE_WAIT_MS").pipe(
    Config.validate({ message: "SWARMGATE_QUEUE_WAIT_MS must be 0 or more", validation: (n) => n >= 0 }),
    Config.withDefault(DEFAULT_QUEUE_WAIT_MILLIS),
  ),
})

/** Where the limiter keeps its state, and what happens when that store fails. */
export const storeConfig = Config.all({
  redisUrl: Config.option(Config.redacted("REDIS_URL")),
  prefix: Config.string("SWARMGATE_REDIS_PREFIX").pipe(Config.withDefault("swarmgate:quota:")),
  leaseMillis: Config.integer("SWARMGATE_LEASE_MS").pipe(
    Config.validate({ message: "SWARMGATE_LEASE_MS must be at least 300", validation: (n) => n >= 300 }),
    Config.withDefault(15_000),
  ),
  onStoreFailure: Config.literal(
    "closed",
    "open",
  )("SWARMGATE_LIMITS_ON_REDIS_FAILURE").pipe(Config.withDefault("closed" as const)),
  maxInFlight: Config.integer("SWARMGATE_MAX_IN_FLIGHT").pipe(
    Config.validate({ message: "SWARMGATE_MAX_IN_FLIGHT must be at least 1", validation: (n) => n >= 1 }),
    Config.withDefault(DEFAULT_MAX_IN_FLIGHT),
  ),
})

// --- limits of an account -------------------------------------------------------------

const MINUTE = 60_000
const HOUR = 60 * MINUTE

const pick = (own: number | null | undefined, fallback: number | null) => own ?? fallback

/**
 * The account's limits over the defaults. The burst of a rate limit is its
 * whole size: an idle account may send `rpm` requests at once, and after that
 * one per `60 s / rpm` (see the README, Limits).
 */
export const limitsFor = (account: Account, config: LimitsConfigShape): Quota.Limits => {
  const own = account.limits
  const d = config.defaults
  const rpm = pick(own.rpm, d.rpm)
  const rph = pick(own.rph, d.rph)
  const daily = pick(own.daily, d.daily)
  const weekly = pick(own.weekly, d.weekly)
  const concurrency = pick(own.concurrency, d.concurrency)
  const rates: Array<Quota.RateLimit> = []
  if (rpm !== null) rates.push({ name: "rpm", limit: rpm, periodMillis: MINUTE })
  if (rph !== null) rates.push({ name: "rph", limit: rph, periodMillis: HOUR })
  const quotas: Array<Quota.CalendarQuota> = []
  if (daily !== null) quotas.push({ name: "daily", limit: daily, period: "day" })
  if (weekly !== null) quotas.push({ name: "weekly", limit: weekly, period: "week" })
  return {
    rates,
    quotas,
    concurrency:
      concurrency === null
        ? undefined
        : { limit: concurrency, queue: pick(own.queue, d.queue) ?? 0, maxWaitMillis: config.queueWaitMillis },
  }
}

/**
 * How long a request may wait for the account's other running requests to
 * settle the money it needs: the queue's wait, when the account may queue
 * (a queue above 0, or no concurrency limit at all); else no wait.
 */
export const moneyWaitMillis = (account: Account, config: LimitsConfigShape): number => {
  const concurrency = cachedLimitsFor(account, config).concurrency
  return concurrency === undefined || (concurrency.queue ?? 0) > 0 ? config.queueWaitMillis : 0
}

/**
 * `limitsFor`, once per account record and configuration: the key cache hands
 * out the same account object until it changes, so the limits (and what the
 * quota service derives from them) are built once, not per request.
 */
const limitsCache = new WeakMap<
  Account,
  { readonly config: LimitsConfigShape; readonly limits: Quota.Limits }
>()

export const cachedLimitsFor = (account: Account, config: LimitsConfigShape): Quota.Limits => {
  const hit = limitsCache.get(account)
  if (hit !== undefined && hit.config === config) return hit.limits
  const limits = limitsFor(account, config)
  limitsCache.set(account, { config, limits })
  return limits
}

// --- headers ------------------------------------------------------------------------

/** OpenAI's duration style: `17ms`, `1s`, `1.5s`, `6m0s`, `1h0m0s`. */
export const formatReset = (millis: number): string => {
  const ms = Math.max(0, Math.ceil(millis))
  if (ms < 1_000) return `${ms}ms`
  const hours = Math.floor(ms / HOUR)
  const minutes = Math.floor((ms % HOUR) / MINUTE)
  const seconds = Number(((ms % MINUTE) / 1_000).toFixed(3))
  if (hours > 0) return `${hours}h${minutes}m${seconds}s`
  if (minutes > 0) return `${minutes}m${seconds}s`
  return `${seconds}s`
}

/** The request limit closest to refusing (fewest remaining), as OpenAI clients expect it. */
const RATE_HEADERS = [
  "x-ratelimit-limit-requests",
  "x-ratelimit-remaining-requests",
  "x-ratelimit-reset-requests",
] as const

export const setRateHeaders = (res: ServerResponse, rates: ReadonlyArray<Quota.RateStatus>) => {
  let binding: Quota.RateStatus | undefined
  for (const rate of rates) if (binding === undefined || rate.remaining < binding.remaining) binding = rate
  if (binding === undefined || res.headersSent) return
  res.setHeader("x-ratelimit-limit-requests", String(binding.limit))
  res.setHeader("x-ratelimit-remaining-requests", String(binding.remaining))
  res.setHeader("x-ratelimit-reset-requests", formatReset(binding.resetMillis))
}

/** Counted only if it ran: a request refused later (billing, dispatch) shows no counts it did not use. */
const dropRateHeadersUnlessCounted = (res: ServerResponse, committed: boolean) => {
  if (!committed && !res.headersSent) for (const name of RATE_HEADERS) res.removeHeader(name)
}

// --- the request path -------------------------------------------------------------------

/** What the quota service admits: the account's limits on `model`. */
export const admitRequest = (
  principal: Principal,
  model: string,
  config: LimitsConfigShape,
): Quota.AdmitRequest => ({
  subject: principal.account.id,
  resource: model,
  limits: cachedLimitsFor(principal.account, config),
})

/**
 * `admit` by plain calls, where the quota service decides at once (the
 * memory store): the permit, released by a plain cleanup of `scope`, or the
 * refusal; undefined when only `admit` can decide (a queue wait, a remote
 * store), with nothing changed.
 */
export const admitNow = (
  res: ServerResponse,
  quota: Quota.QuotaShape,
  request: Quota.AdmitRequest,
  outcome: Pick<Outcome, "started">,
  scope: Scope.Scope,
  clock: Clock.Clock,
): Either.Either<Quota.Permit, Quota.Refusal | AdmissionUnavailable> | undefined => {
  const now = quota.admitNow(request, clock)
  if (now._tag === "Refused") {
    setRateHeaders(res, now.rates)
    return Either.left(now.error)
  }
  if (now._tag === "Async") return undefined
  const { permit } = now
  setRateHeaders(res, permit.rates)
  Finalizers.addNow(scope, () => {
    // A request that started counts even if nothing committed it yet.
    if (outcome.started) permit.commit()
    dropRateHeadersUnlessCounted(res, permit.committed())
    permit.release()
  })
  return Either.right({
    rates: permit.rates,
    commit: Effect.sync(permit.commit),
    commitNow: permit.commit,
    isCommitted: Effect.sync(permit.committed),
  })
}

/**
 * Admits the request into the caller's scope, per account and model, and sets
 * the `x-ratelimit-*` headers (on refusals too).
 */
export const admit = (
  res: ServerResponse,
  principal: Principal,
  model: string,
  outcome: Pick<Outcome, "started">,
): Effect.Effect<
  Quota.Permit,
  RateLimitExceeded | ConcurrencyLimitExceeded | AdmissionUnavailable,
  Quota.Quota | LimitsConfig | Scope.Scope
> =>
  Effect.withFiberRuntime((fiber) => {
    const context = fiber.currentContext
    const config = Context.unsafeGet(context, LimitsConfig)
    const quota = Context.unsafeGet(context, Quota.Quota)
    const scope = Context.unsafeGet(context, Scope.Scope)
    const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
    const request = admitRequest(principal, model, config)
    return (
      admitNow(res, quota, request, outcome, scope, clock) ??
      admitWaiting(res, quota, request, outcome, scope)
    )
  })

/**
 * Releases a sent admission, its script sent at the call: a request that
 * started counts even if nothing committed it yet, and one `admitted` but
 * not counted (refused later: billing, dispatch) shows no counts it did not
 * use; a refusal's own headers stay.
 */
export const releaseSent = (
  res: ServerResponse,
  admitting: Quota.AdmissionSent,
  outcome: Pick<Outcome, "started">,
  admitted: boolean,
): Effect.Effect<void> => {
  const released = admitting.release(outcome.started)
  if (admitted) dropRateHeadersUnlessCounted(res, admitting.committed())
  return released
}

// The generator bodies below are declared once, not made per call (HttpServer.ts says why).

/** Runs before the release: a request that started counts even if nothing committed it yet. */
function* countedBody(permit: Quota.Permit, outcome: Pick<Outcome, "started">, res: ServerResponse) {
  if (outcome.started) yield* permit.commit
  dropRateHeadersUnlessCounted(res, yield* permit.isCommitted)
}

function* admitWaitingBody(
  res: ServerResponse,
  quota: Quota.QuotaShape,
  request: Quota.AdmitRequest,
  outcome: Pick<Outcome, "started">,
  scope: Scope.Scope,
) {
  // The quota service's Effect path reads its scope from the context: given it here, for this call only.
  const admission = yield* Effect.provideService(quota.admit(request), Scope.Scope, scope)
  if (admission._tag === "Refused") {
    setRateHeaders(res, admission.rates)
    return yield* Effect.fail(admission.error)
  }
  setRateHeaders(res, admission.permit.rates)
  const { permit } = admission
  yield* Scope.addFinalizer(
    scope,
    Effect.gen(() => countedBody(permit, outcome, res)),
  )
  return permit
}

/**
 * `admit` where `admitNow` could not decide: through the quota service's
 * Effect path (a queue wait, or a remote store: Redis), its permit released
 * when `scope` closes.
 */
export const admitWaiting = (
  res: ServerResponse,
  quota: Quota.QuotaShape,
  request: Quota.AdmitRequest,
  outcome: Pick<Outcome, "started">,
  scope: Scope.Scope,
) => Effect.gen(() => admitWaitingBody(res, quota, request, outcome, scope))

// --- the admin view -----------------------------------------------------------------------

export interface UsageNow {
  readonly concurrency: number
  readonly queued: number
  /** By model; `null` when the limit does not apply. */
  readonly rpm_remaining: Readonly<Record<string, number>> | null
  readonly rph_remaining: Readonly<Record<string, number>> | null
  readonly daily_remaining: number | null
  readonly weekly_remaining: number | null
}

export class AccountUsage extends Context.Tag("@swarmgate/gateway/AccountUsage")<
  AccountUsage,
  { readonly usageNow: (account: Account) => Effect.Effect<UsageNow, AdmissionUnavailable> }
>() {}

export const makeAccountUsage = Effect.gen(function* () {
  const quota = yield* Quota.Quota
  const config = yield* LimitsConfig
  const dispatcher = yield* Dispatcher.Dispatcher
  const models = dispatcher.presets.map((preset) => preset.id)
  return {
    usageNow: (account: Account) =>
      Effect.map(
        quota.usage({ subject: account.id, limits: limitsFor(account, config) }, models),
        (usage): UsageNow => {
          const byModel = (name: string) => {
            if (!usage.rates.get(models[0] ?? "")?.some((r) => r.name === name)) return null
            return Object.fromEntries(
              models.map((model) => [
                model,
                usage.rates.get(model)?.find((r) => r.name === name)?.remaining ?? 0,
              ]),
            )
          }
          const quotaLeft = (name: string) => usage.quotas.find((q) => q.name === name)?.remaining ?? null
          return {
            concurrency: usage.concurrency,
            queued: usage.queued,
            rpm_remaining: byModel("rpm"),
            rph_remaining: byModel("rph"),
            daily_remaining: quotaLeft("daily"),
            weekly_remaining: quotaLeft("weekly"),
          }
        },
      ),
  }
})

/** The account's limit state when this process admits requests; undefined in the CLI, or when the store is away. */
export const usageNowOf = (account: Account): Effect.Effect<UsageNow | undefined> =>
  Effect.flatMap(Effect.serviceOption(AccountUsage), (service) =>
    Option.isNone(service)
      ? Effect.succeed(undefined)
      : Effect.catchAll(service.value.usageNow(account), () => Effect.succeed(undefined)),
  )

// --- layers ---------------------------------------------------------------------------------

const quotaLayer = (store: Config.Config.Success<typeof storeConfig>, queueWaitMillis: number) => {
  const common = {
    maxInFlight: store.maxInFlight,
    maxQueueWaitMillis: queueWaitMillis,
    onStoreFailure: store.onStoreFailure,
  }
  // An empty REDIS_URL means none: ioredis would read "" as localhost.
  const url = Option.filter(store.redisUrl, (u) => Redacted.value(u).trim().length > 0)
  return Option.match(url, {
    onNone: () => Quota.layerMemory(common),
    onSome: (url: Redacted.Redacted) =>
      Quota.layerRedis({ ...common, url, prefix: store.prefix, leaseMillis: store.leaseMillis }),
  })
}

/** Everything limits need, from the environment: memory by default, Redis when `REDIS_URL` is set. */
export const layerFromEnv: Layer.Layer<
  Quota.Quota | LimitsConfig | AccountUsage,
  ConfigError.ConfigError,
  Dispatcher.Dispatcher
> = Layer.unwrapEffect(
  Effect.map(Effect.all([config, storeConfig]), ([limits, store]) => {
    const base = Layer.merge(quotaLayer(store, limits.queueWaitMillis), Layer.succeed(LimitsConfig, limits))
    return Layer.provideMerge(Layer.effect(AccountUsage, makeAccountUsage), base)
  }),
)

/** The memory store with the given configuration (tests, embedding). */
export const layer = (overrides: Partial<LimitsConfigShape> = {}, options: Quota.QuotaOptions = {}) => {
  const limits = { defaults, queueWaitMillis: DEFAULT_QUEUE_WAIT_MILLIS, ...overrides }
  const base = Layer.merge(Quota.layerMemory(options), Layer.succeed(LimitsConfig, limits))
  return Layer.provideMerge(Layer.effect(AccountUsage, makeAccountUsage), base)
}
