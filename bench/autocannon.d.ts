/**
 * The part of autocannon 8's programmatic API the bench uses (the package
 * ships no types; see node_modules/autocannon/README.md, "API").
 */
declare module "autocannon" {
  import type { EventEmitter } from "node:events"

  namespace autocannon {
    interface Options {
      readonly url: string
      readonly method?: string
      readonly headers?: Readonly<Record<string, string>>
      readonly body?: string | Buffer
      readonly connections?: number
      readonly pipelining?: number
      /** Seconds; the run ends at the first sample tick (`sampleInt`, default 1 s) after it. */
      readonly duration?: number
      readonly amount?: number
      /** Seconds. */
      readonly timeout?: number
      readonly sampleInt?: number
      readonly title?: string
    }

    interface Histogram {
      readonly average: number
      readonly mean: number
      readonly stddev: number
      readonly min: number
      readonly max: number
      readonly total: number
      readonly p50: number
      readonly p99: number
    }

    interface Result {
      readonly url: string
      /** Seconds, from the start of the run to its last sample tick. */
      readonly duration: number
      readonly connections: number
      /** Per-sample counts; `total` = completed responses of any status. */
      readonly requests: Histogram & { readonly sent: number }
      /** Milliseconds, in a histogram of whole milliseconds. */
      readonly latency: Histogram & { readonly totalCount: number }
      readonly throughput: Histogram
      /** Connection errors, timeouts included. */
      readonly errors: number
      readonly timeouts: number
      readonly mismatches: number
      readonly non2xx: number
      readonly "2xx": number
      readonly statusCodeStats: Readonly<Record<string, { readonly count: number }>>
    }

    interface Instance extends EventEmitter, PromiseLike<Result> {
      /** Every response: its status, its size and its time in (fractional) milliseconds. */
      on(
        event: "response",
        listener: (client: unknown, statusCode: number, resBytes: number, responseTimeMillis: number) => void,
      ): this
      on(event: string, listener: (...args: Array<unknown>) => void): this
      stop(): void
    }
  }

  function autocannon(options: autocannon.Options): autocannon.Instance

  export = autocannon
}
