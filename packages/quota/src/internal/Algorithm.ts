/**
 * The arithmetic both stores share (the Redis scripts mirror it line for line).
 * Times are integer microseconds, so a Lua double holds them exactly.
 *
 * GCRA with reservations: `tat` is the theoretical arrival time of the charged
 * requests, `pending` counts admitted requests not yet charged (they may still
 * be refunded). A request is admitted at `now` when
 *
 *     v = max(tat, now) + pending·interval   satisfies   v − now ≤ tolerance
 *
 * and a charge (commit) sets `tat = max(tat, now) + interval`. Charges made
 * this way conform to plain GCRA, so the charged requests in any window of
 * length W number at most `burst + W / interval` — while a refund only drops a
 * reservation and so cannot hand back capacity that time already refilled.
 */

export const MICROS_PER_MILLI = 1_000
export const MICROS_PER_SECOND = 1_000_000
export const MICROS_PER_DAY = 86_400 * MICROS_PER_SECOND

/** A rate limit in the units the stores work in. `interval < 0` marks a limit of 0 (nothing passes). */
export interface RateParams {
  readonly name: string
  readonly limit: number
  readonly periodMicros: number
  /** Emission interval: the period divided by the limit, rounded up (never faster than the limit). */
  readonly interval: number
  /** Burst tolerance: `(burst − 1) · interval`. */
  readonly tolerance: number
}

export const rateParams = (name: string, limit: number, periodMillis: number, burst: number): RateParams => {
  const periodMicros = Math.round(periodMillis * MICROS_PER_MILLI)
  if (limit === 0) return { name, limit, periodMicros, interval: -1, tolerance: 0 }
  const interval = Math.ceil(periodMicros / limit)
  return { name, limit, periodMicros, interval, tolerance: (burst - 1) * interval }
}

/** `max(tat, now) + pending · interval`: where the limiter stands once every reservation is charged. */
export const virtualTat = (rate: RateParams, tat: number, pending: number, now: number) =>
  Math.max(tat, now) + pending * rate.interval

/** Microseconds until one more request conforms; 0 when it conforms now. */
export const rateWait = (rate: RateParams, tat: number, pending: number, now: number): number => {
  if (rate.interval < 0) return rate.periodMicros
  return Math.max(0, virtualTat(rate, tat, pending, now) - rate.tolerance - now)
}

export interface RateState {
  readonly name: string
  readonly limit: number
  /** Requests that would be admitted right now, one after the other. */
  readonly remaining: number
  /** Until the limiter is back to its idle state (full burst available), in microseconds. */
  readonly resetMicros: number
}

export const rateState = (rate: RateParams, tat: number, pending: number, now: number): RateState => {
  if (rate.interval < 0) return { name: rate.name, limit: 0, remaining: 0, resetMicros: rate.periodMicros }
  const v = virtualTat(rate, tat, pending, now)
  return {
    name: rate.name,
    limit: rate.limit,
    remaining: Math.max(0, Math.floor((now + rate.tolerance - v) / rate.interval) + 1),
    resetMicros: v - now,
  }
}

/** The new theoretical arrival time after charging one request at `now`. */
export const charge = (rate: RateParams, tat: number, now: number) => Math.max(tat, now) + rate.interval

// --- calendar quotas ---------------------------------------------------------------

export type QuotaPeriod = "day" | "week"

/** UTC calendar day, or ISO week (Monday 00:00 UTC); 1970-01-01 was a Thursday, so weeks are offset by 3 days. */
export const periodIndex = (period: QuotaPeriod, now: number): number => {
  const day = Math.floor(now / MICROS_PER_DAY)
  return period === "day" ? day : Math.floor((day + 3) / 7)
}

export const periodEnd = (period: QuotaPeriod, index: number): number =>
  period === "day" ? (index + 1) * MICROS_PER_DAY : ((index + 1) * 7 - 3) * MICROS_PER_DAY

// --- concurrency ---------------------------------------------------------------------

/** Assumed slot hold time before any request of the subject has finished. */
export const DEFAULT_HOLD_MICROS = MICROS_PER_SECOND

/** Weight of the newest hold time in the moving average. */
export const EWMA_WEIGHT = 0.2

export const nextEwma = (previous: number | undefined, sample: number) =>
  previous === undefined ? sample : Math.floor((1 - EWMA_WEIGHT) * previous + EWMA_WEIGHT * sample)

/**
 * When a refused request could expect a slot: `ahead + 1` slots must free up,
 * `limit` at a time, each after about one average hold time.
 */
export const concurrencyWait = (limit: number, ahead: number, ewma: number | undefined): number => {
  if (limit <= 0) return Number.POSITIVE_INFINITY
  return Math.ceil((ahead + 1) / limit) * (ewma ?? DEFAULT_HOLD_MICROS)
}
