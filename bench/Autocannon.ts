/**
 * The generator's outside check: autocannon, a load generator we did not
 * write (its own HTTP/1.1 client on raw sockets, no undici, no node:http),
 * sending the very request `apps/loadtest` sends — same method, path, body and
 * headers — over the same number of keep-alive connections, in this process,
 * so on the generator's core like our own runs.
 *
 * Its figures are its own: req/s = its completed responses ÷ its run's
 * duration; the latency is its per-request timer (request written → response
 * complete, fractional ms, from its `response` event), because its latency
 * histogram keeps whole milliseconds (a direct node's p50 would read 0). A
 * first run of the warm-up's length is discarded, as our generator discards
 * its warm-up.
 */
import { performance } from "node:perf_hooks"
import autocannon from "autocannon"
import type { LoadOptions } from "../apps/loadtest/src/Options"
import { requestBody } from "../apps/loadtest/src/Runner"
import { CORE_UNDER_TEST, pinAll } from "./Measure"
import { coreTimes, cpuMicros } from "./Procfs"

export interface AutocannonMeasured {
  /** Completed responses (any status) per second over autocannon's run. */
  readonly rps: number
  /** Latencies in µs. */
  readonly e2eP50: number
  readonly e2eP99: number
  readonly responses: number
  readonly non2xx: number
  readonly statusCodes: Readonly<Record<string, number>>
  /** Connection errors, timeouts included. */
  readonly errors: number
  readonly seconds: number
  /** This process's CPU over the run, % of one core. */
  readonly generatorCpuPercent: number
  /** The process under test's CPU per response, µs. */
  readonly cpuMicrosPerRequest: number
  /** What else ran on core 1 meanwhile, % of the core. */
  readonly foreignPercent: number
}

/** As `apps/loadtest`'s clients send them; autocannon adds Content-Length itself. */
const headersOf = (options: LoadOptions) => ({
  authorization: `Bearer ${options.key}`,
  "content-type": "application/json",
  accept: "application/json, text/event-stream",
})

const percentile = (sorted: ReadonlyArray<number>, p: number) =>
  sorted.length === 0 ? Number.NaN : sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)]!

/** One warm-up and one measured autocannon run of `options` (URL, key, body, concurrency, durations). */
export const measureAutocannon = async (
  options: LoadOptions,
  underTest: number,
  others: ReadonlyArray<number>,
): Promise<AutocannonMeasured> => {
  if (options.stream) throw new Error("the autocannon cross-check sends JSON requests only")
  pinAll([...others, underTest], underTest)
  await new Promise((r) => setTimeout(r, 200))
  const common: autocannon.Options = {
    url: options.url,
    method: "POST",
    headers: headersOf(options),
    body: requestBody(options),
    connections: options.concurrency,
    timeout: options.timeoutMillis / 1000,
  }
  if (options.warmupMillis > 0) await autocannon({ ...common, duration: options.warmupMillis / 1000 })

  const times: Array<number> = []
  const before = { cpu: cpuMicros(underTest), core: coreTimes(CORE_UNDER_TEST), self: process.cpuUsage() }
  const start = performance.now()
  const instance = autocannon({ ...common, duration: options.durationMillis / 1000 })
  instance.on("response", (_client, _status, _bytes, millis) => {
    times.push(millis)
  })
  const result = await instance
  const wallMicros = Math.max(1, (performance.now() - start) * 1000)
  const self = process.cpuUsage(before.self)
  const cpu = cpuMicros(underTest) - before.cpu
  const core = coreTimes(CORE_UNDER_TEST)
  times.sort((a, b) => a - b)
  const responses = result.requests.total
  return {
    rps: responses / Math.max(0.001, result.duration),
    e2eP50: percentile(times, 50) * 1000,
    e2eP99: percentile(times, 99) * 1000,
    responses,
    non2xx: result.non2xx,
    statusCodes: Object.fromEntries(
      Object.entries(result.statusCodeStats).map(([code, s]) => [code, s.count]),
    ),
    errors: result.errors,
    seconds: result.duration,
    generatorCpuPercent: ((self.user + self.system) / wallMicros) * 100,
    cpuMicrosPerRequest: responses === 0 ? Number.NaN : cpu / responses,
    foreignPercent: Math.max(
      0,
      ((core.busy - before.core.busy - cpu) / Math.max(1, core.total - before.core.total)) * 100,
    ),
  }
}
