/**
 * The JSON result of a run (`result.json`): configuration, vLLM-style
 * metrics over the measured window, histograms and the per-second series.
 * Times are milliseconds with microsecond decimals; a metric without
 * samples is null.
 */
import type { Bin, Summary } from "./Histogram"
import type { LoadOptions } from "./Options"
import type { Recorder } from "./Recorder"

export const RESULT_SCHEMA = "swarmgate-loadtest/1"

export interface LoadResult {
  readonly schema: typeof RESULT_SCHEMA
  readonly label: string | null
  readonly started_at: string
  readonly config: {
    readonly endpoint: string
    readonly model: string
    readonly stream: boolean
    readonly max_tokens: number | null
    readonly mode: "closed" | "open"
    readonly concurrency: number
    readonly rate: number | null
    readonly duration_s: number
    readonly warmup_s: number
    readonly ramp_s: number
    readonly timeout_s: number
    readonly client: string
    readonly prompt_chars: number
    readonly seed: number
  }
  /** The measured window actually run (shorter when stopped early). */
  readonly window_s: number
  readonly requests: {
    readonly total: number
    readonly succeeded: number
    readonly failed: number
    readonly throughput_rps: number
    readonly statuses: Readonly<Record<string, number>>
  }
  readonly tokens: {
    readonly output_total: number
    readonly output_tps: number
    readonly content_chunks: number
    readonly chunks_per_s: number
  }
  readonly latency_ms: {
    readonly ttft: Summary
    readonly itl: Summary
    readonly tpot: Summary
    readonly e2e: Summary
  }
  readonly errors: Readonly<Record<string, number>>
  readonly goodput: {
    readonly slo: {
      readonly ttft_ms: number | null
      readonly tpot_ms: number | null
      readonly e2el_ms: number | null
    }
    readonly requests: number
    readonly rps: number
    readonly ratio: number
  } | null
  readonly histograms_ms: {
    readonly ttft: ReadonlyArray<Bin>
    readonly itl: ReadonlyArray<Bin>
    readonly tpot: ReadonlyArray<Bin>
    readonly e2e: ReadonlyArray<Bin>
  }
  readonly timeseries: ReadonlyArray<{
    readonly t: number
    readonly warmup: boolean
    readonly completed: number
    readonly errors: number
    readonly tokens: number
    readonly chunks: number
    readonly e2e_mean_ms: number | null
  }>
  readonly client: {
    /** CPU time of the generator over the window, as a share of one core. */
    readonly cpu_percent: number
    /** Event-loop delay of the generator: what it adds to every latency at worst. */
    readonly loop_delay_p99_ms: number
    readonly max_in_flight: number
    /** At the end of the window: requests sent and not ended, and those of them already streaming tokens. */
    readonly in_flight_at_end: number
    readonly streaming_at_end: number
  }
}

const round = (value: number, digits = 3) => {
  if (!Number.isFinite(value)) return Number.NaN
  const f = 10 ** digits
  return Math.round(value * f) / f
}

const roundSummary = (s: Summary): Summary => ({
  count: s.count,
  min: round(s.min),
  max: round(s.max),
  mean: round(s.mean),
  p50: round(s.p50),
  p90: round(s.p90),
  p99: round(s.p99),
})

export interface RunFacts {
  readonly options: LoadOptions
  readonly label: string | undefined
  readonly startedAt: Date
  readonly cpuMicros: number
  readonly loopDelayP99Millis: number
  readonly maxInFlight: number
  readonly atEnd?: { readonly inFlight: number; readonly streaming: number } | undefined
}

export const summarize = (recorder: Recorder, facts: RunFacts): LoadResult => {
  const { options } = facts
  const windowMillis = Math.max(1, recorder.windowEndMillis - recorder.windowStartMillis)
  const seconds = windowMillis / 1000
  const total = recorder.succeeded + recorder.failed
  const warmupBuckets = Math.floor((recorder.windowStartMillis - recorder.runStartMillis) / 1000)
  const slo = options.slo
  return {
    schema: RESULT_SCHEMA,
    label: facts.label ?? null,
    started_at: facts.startedAt.toISOString(),
    config: {
      endpoint: options.url,
      model: options.model,
      stream: options.stream,
      max_tokens: options.maxTokens ?? null,
      mode: options.rate === undefined ? "closed" : "open",
      concurrency: options.concurrency,
      rate: options.rate ?? null,
      duration_s: options.durationMillis / 1000,
      warmup_s: options.warmupMillis / 1000,
      ramp_s: (options.rampMillis ?? 0) / 1000,
      timeout_s: options.timeoutMillis / 1000,
      client: options.client,
      prompt_chars: options.prompt.length,
      seed: options.seed,
    },
    window_s: round(seconds),
    requests: {
      total,
      succeeded: recorder.succeeded,
      failed: recorder.failed,
      throughput_rps: round(recorder.succeeded / seconds, 2),
      statuses: Object.fromEntries([...recorder.statuses].sort(([a], [b]) => a - b)),
    },
    tokens: {
      output_total: recorder.outputTokens,
      output_tps: round(recorder.outputTokens / seconds, 1),
      content_chunks: recorder.chunks,
      chunks_per_s: round(recorder.chunks / seconds, 1),
    },
    latency_ms: {
      ttft: roundSummary(recorder.ttft.summaryMillis()),
      itl: roundSummary(recorder.itl.summaryMillis()),
      tpot: roundSummary(recorder.tpot.summaryMillis()),
      e2e: roundSummary(recorder.e2e.summaryMillis()),
    },
    errors: Object.fromEntries([...recorder.errors].sort(([, a], [, b]) => b - a)),
    goodput:
      slo === undefined
        ? null
        : {
            slo: {
              ttft_ms: slo.ttftMillis ?? null,
              tpot_ms: slo.tpotMillis ?? null,
              e2el_ms: slo.e2elMillis ?? null,
            },
            requests: recorder.good,
            rps: round(recorder.good / seconds, 2),
            ratio: total === 0 ? 0 : round(recorder.good / total, 4),
          },
    histograms_ms: {
      ttft: recorder.ttft.logBinsMillis(),
      itl: recorder.itl.logBinsMillis(),
      tpot: recorder.tpot.logBinsMillis(),
      e2e: recorder.e2e.logBinsMillis(),
    },
    timeseries: recorder.series.map((b) => ({
      t: b.t,
      warmup: b.t < warmupBuckets,
      completed: b.completed,
      errors: b.errors,
      tokens: b.tokens,
      chunks: b.chunks,
      e2e_mean_ms: b.completed === 0 ? null : round(b.e2eSumMillis / b.completed),
    })),
    client: {
      cpu_percent: round((facts.cpuMicros / 1000 / windowMillis) * 100, 1),
      loop_delay_p99_ms: round(facts.loopDelayP99Millis),
      max_in_flight: facts.maxInFlight,
      in_flight_at_end: facts.atEnd?.inFlight ?? 0,
      streaming_at_end: facts.atEnd?.streaming ?? 0,
    },
  }
}
