/**
 * Aggregates outcomes as they arrive: vLLM's client-side metrics over the
 * measured window, and one-second buckets over the whole run for the charts.
 * A request counts when it ends inside the window; a token when it arrives
 * inside it.
 */
import type { Outcome } from "./Exchange"
import { Histogram } from "./Histogram"
import type { Slo } from "./Options"

export interface SecondBucket {
  /** Seconds since the run started (warm-up included). */
  readonly t: number
  completed: number
  errors: number
  tokens: number
  chunks: number
  e2eSumMillis: number
}

export class Recorder {
  readonly ttft = new Histogram()
  readonly itl = new Histogram()
  readonly tpot = new Histogram()
  readonly e2e = new Histogram()
  readonly errors = new Map<string, number>()
  readonly statuses = new Map<number, number>()
  succeeded = 0
  failed = 0
  good = 0
  outputTokens = 0
  chunks = 0
  readonly series: Array<SecondBucket> = []

  constructor(
    readonly runStartMillis: number,
    readonly windowStartMillis: number,
    /** Moves earlier when the run is stopped. */
    public windowEndMillis: number,
    readonly slo: Slo | undefined,
  ) {}

  inWindow(now: number): boolean {
    return now >= this.windowStartMillis && now < this.windowEndMillis
  }

  private bucket(now: number): SecondBucket {
    const t = Math.max(0, Math.floor((now - this.runStartMillis) / 1000))
    while (this.series.length <= t)
      this.series.push({
        t: this.series.length,
        completed: 0,
        errors: 0,
        tokens: 0,
        chunks: 0,
        e2eSumMillis: 0,
      })
    return this.series[t]!
  }

  readonly token = (now: number, gapMillis: number | undefined): void => {
    this.bucket(now).chunks++
    if (!this.inWindow(now)) return
    this.chunks++
    if (gapMillis !== undefined) this.itl.recordMillis(gapMillis)
  }

  record(outcome: Outcome): void {
    const now = outcome.endMillis
    const bucket = this.bucket(now)
    const e2e = now - outcome.startMillis
    if (outcome.ok) {
      bucket.completed++
      bucket.tokens += outcome.outputTokens
      bucket.e2eSumMillis += e2e
    } else bucket.errors++
    if (!this.inWindow(now)) return
    this.statuses.set(outcome.status, (this.statuses.get(outcome.status) ?? 0) + 1)
    if (!outcome.ok) {
      this.failed++
      const code = outcome.code ?? "unknown"
      this.errors.set(code, (this.errors.get(code) ?? 0) + 1)
      return
    }
    this.succeeded++
    this.outputTokens += outcome.outputTokens
    this.e2e.recordMillis(e2e)
    const ttft =
      outcome.firstTokenMillis === undefined ? undefined : outcome.firstTokenMillis - outcome.startMillis
    if (ttft !== undefined) this.ttft.recordMillis(ttft)
    const tpot =
      ttft !== undefined && outcome.outputTokens > 1 ? (e2e - ttft) / (outcome.outputTokens - 1) : undefined
    if (tpot !== undefined) this.tpot.recordMillis(tpot)
    if (this.meetsSlo(ttft, tpot, e2e)) this.good++
  }

  private meetsSlo(ttft: number | undefined, tpot: number | undefined, e2e: number): boolean {
    const slo = this.slo
    if (slo === undefined) return true
    if (slo.ttftMillis !== undefined && (ttft === undefined || ttft > slo.ttftMillis)) return false
    if (slo.tpotMillis !== undefined && tpot !== undefined && tpot > slo.tpotMillis) return false
    if (slo.e2elMillis !== undefined && e2e > slo.e2elMillis) return false
    return true
  }
}
