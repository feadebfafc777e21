/**
 * What the dispatcher has seen of one node: moving averages of its time to
 * first token, speed and errors, a window of recent first-token times for the
 * hedging threshold, and a circuit breaker. Plain state with the time passed
 * in, so the rules are tested without a clock.
 *
 * Circuit: closed → open after `failureThreshold` failures in a row (or an
 * error rate over `errorRateThreshold` once `minSamples` requests were seen);
 * open → half-open when its cool-down has passed; half-open admits one trial
 * (a probe or a request): success closes it, failure opens it again with a
 * doubled cool-down.
 */

export type CircuitState = "closed" | "open" | "half_open"

export interface HealthOptions {
  /** Weight of the newest sample in the moving averages. */
  readonly ewmaAlpha: number
  readonly failureThreshold: number
  readonly errorRateThreshold: number
  readonly minSamples: number
  /** First cool-down of an open circuit; doubled on each failed trial up to `maxOpenMillis`. */
  readonly openMillis: number
  readonly maxOpenMillis: number
  /** First-token times kept for the percentile. */
  readonly window: number
}

export const defaultHealthOptions: HealthOptions = {
  ewmaAlpha: 0.2,
  failureThreshold: 3,
  errorRateThreshold: 0.5,
  minSamples: 10,
  openMillis: 5_000,
  maxOpenMillis: 60_000,
  window: 64,
}

/** Samples needed before a node's own percentile is trusted. */
export const MIN_PERCENTILE_SAMPLES = 8

export interface HealthSnapshot {
  readonly circuit: CircuitState
  readonly requests: number
  readonly failures: number
  readonly errorRate: number
  readonly ttftMillis: number | undefined
  readonly ttftP95Millis: number | undefined
  readonly tokensPerSecond: number | undefined
  readonly reputation: number
  readonly lastFailure: string | undefined
}

const ewma = (previous: number | undefined, sample: number, alpha: number) =>
  previous === undefined ? sample : previous + alpha * (sample - previous)

export class NodeHealth {
  ttftMillis: number | undefined = undefined
  tokensPerSecond: number | undefined = undefined
  /** Moving average of 1 (failed) / 0 (succeeded). */
  errorRate = 0
  requests = 0
  failures = 0
  consecutiveFailures = 0
  circuit: CircuitState = "closed"
  openUntil = 0
  reopenings = 0
  /** The one request or probe a half-open circuit lets through (its token). */
  trial: number | undefined = undefined
  private trials = 0
  /** Agreement of this node's judgements with the consensus, 0..1. */
  reputation = 0.75
  lastFailure: string | undefined = undefined
  /** Last time a request or probe started on the node. */
  lastActivity = 0
  private readonly samples: Array<number> = []
  private next = 0
  /**
   * The same samples kept in order as they come and go (the first `samples.length`
   * slots): each request adds one, and sorting the window for every hedge
   * decision cost ~1 % of a request's CPU; a sorted insert and removal is a
   * binary search and a short move.
   */
  private readonly sorted: Float64Array

  constructor(readonly options: HealthOptions = defaultHealthOptions) {
    this.sorted = new Float64Array(options.window)
  }

  /** Whether a new request may go to the node now; moves an open circuit past its cool-down to half-open. */
  admits(now: number): boolean {
    if (this.circuit === "open" && now >= this.openUntil) this.circuit = "half_open"
    if (this.circuit === "closed") return true
    return this.circuit === "half_open" && this.trial === undefined
  }

  /** Call when a request or probe starts; returns a token when it is the half-open trial. */
  start(now: number): number | undefined {
    this.lastActivity = now
    if (this.circuit !== "half_open") return undefined
    this.trial = ++this.trials
    return this.trial
  }

  /** A trial that ended without a verdict (cancelled) frees the way for the next one. */
  abandon(token: number | undefined): void {
    if (token !== undefined && this.trial === token) this.trial = undefined
  }

  /** The node produced its first token after `millis`: it is up (a half-open circuit closes). */
  firstToken(millis: number, trial: number | undefined): void {
    this.addTtft(millis)
    if (trial !== undefined || this.circuit === "half_open") this.close()
  }

  /**
   * A request ended well (or its reader stopped early); `tokens` in `millis`
   * from the first token give the node's speed. Only this resets the count of
   * failures in a row: a node that starts answers and breaks them is not healthy.
   */
  succeeded(tokens = 0, millis = 0): void {
    this.requests++
    this.consecutiveFailures = 0
    this.errorRate = ewma(this.errorRate, 0, this.options.ewmaAlpha)
    if (tokens > 0 && millis > 0)
      this.tokensPerSecond = ewma(this.tokensPerSecond, (tokens * 1000) / millis, this.options.ewmaAlpha)
  }

  /** A first token that had not come after `millis` when we gave up waiting (a hedge won). */
  slow(millis: number): void {
    if (this.ttftMillis === undefined || millis > this.ttftMillis) this.addTtft(millis)
  }

  failure(now: number, reason: string, trial: number | undefined): void {
    this.requests++
    this.failures++
    this.consecutiveFailures++
    this.lastFailure = reason
    this.errorRate = ewma(this.errorRate, 1, this.options.ewmaAlpha)
    // Requests started before the circuit opened do not extend its cool-down.
    if (this.circuit === "open") return
    const { errorRateThreshold, failureThreshold, minSamples } = this.options
    if (
      trial !== undefined ||
      this.circuit === "half_open" ||
      this.consecutiveFailures >= failureThreshold ||
      (this.requests >= minSamples && this.errorRate >= errorRateThreshold)
    )
      this.open(now)
  }

  /** A successful probe: evidence the node works, without a latency sample. */
  probeSucceeded(trial: number | undefined): void {
    this.consecutiveFailures = 0
    if (trial !== undefined || this.circuit === "half_open") this.close()
  }

  /** 95th percentile of recent first-token times; undefined until there are enough. */
  p95(): number | undefined {
    const n = this.samples.length
    if (n < MIN_PERCENTILE_SAMPLES) return undefined
    return this.sorted[nearestRank(n, 0.95)]
  }

  /** The recent first-token times (the window), in ascending order. */
  recentTtfts(): ReadonlyArray<number> {
    return Array.from(this.sorted.subarray(0, this.samples.length))
  }

  snapshot(now: number): HealthSnapshot {
    this.admits(now)
    return {
      circuit: this.circuit,
      requests: this.requests,
      failures: this.failures,
      errorRate: this.errorRate,
      ttftMillis: this.ttftMillis,
      ttftP95Millis: this.p95(),
      tokensPerSecond: this.tokensPerSecond,
      reputation: this.reputation,
      lastFailure: this.lastFailure,
    }
  }

  private addTtft(millis: number) {
    // A time that is not a number would have no place in the order: it is neither kept nor averaged.
    if (Number.isNaN(millis)) return
    this.ttftMillis = ewma(this.ttftMillis, millis, this.options.ewmaAlpha)
    const sorted = this.sorted
    let n = this.samples.length
    if (n < this.options.window) this.samples.push(millis)
    else {
      // The oldest sample leaves the order: any slot holding its value will do.
      const at = firstAtLeast(sorted, n, this.samples[this.next]!)
      sorted.copyWithin(at, at + 1, n)
      n--
      this.samples[this.next] = millis
    }
    const at = firstAtLeast(sorted, n, millis)
    sorted.copyWithin(at + 1, at, n)
    sorted[at] = millis
    this.next = (this.next + 1) % this.options.window
  }

  private open(now: number) {
    const { maxOpenMillis, openMillis } = this.options
    this.circuit = "open"
    this.trial = undefined
    this.openUntil = now + Math.min(maxOpenMillis, openMillis * 2 ** this.reopenings)
    this.reopenings++
  }

  private close() {
    this.circuit = "closed"
    this.trial = undefined
    this.reopenings = 0
    this.consecutiveFailures = 0
    // A fresh start: the failures that opened the circuit must not reopen it on the next one.
    this.errorRate = 0
  }
}

/** The first of the `n` ordered values in `sorted` that is not below `value` (`n` when none). */
const firstAtLeast = (sorted: Float64Array, n: number, value: number): number => {
  let lo = 0
  let hi = n
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (sorted[mid]! < value) lo = mid + 1
    else hi = mid
  }
  return lo
}

/** Index of the nearest-rank `p` percentile among `n` sorted samples. */
const nearestRank = (n: number, p: number) => Math.min(n - 1, Math.max(0, Math.ceil(p * n) - 1))

/** Nearest-rank percentile of unsorted samples. */
export const percentile = (samples: ReadonlyArray<number>, p: number): number | undefined => {
  if (samples.length === 0) return undefined
  const sorted = [...samples].sort((a, b) => a - b)
  return sorted[nearestRank(sorted.length, p)]
}
