/**
 * Drives the load: a closed loop (N requests always in flight, each sent
 * when the previous one ended) or an open loop (Poisson arrivals at a rate,
 * sent whether or not earlier ones ended). In the open loop latency counts
 * from the arrival, not from the send, so a server that falls behind shows
 * it (no coordinated omission).
 *
 * Plain promises rather than Effect on purpose: every microsecond the
 * generator spends per request is a microsecond of measured latency.
 */
import { monitorEventLoopDelay, performance } from "node:perf_hooks"
import { makeClient } from "./Clients"
import { Exchange, type Outcome } from "./Exchange"
import type { LoadOptions } from "./Options"
import { Recorder } from "./Recorder"
import { type LoadResult, summarize } from "./Result"

export interface Progress {
  readonly elapsedMillis: number
  readonly totalMillis: number
  readonly warmingUp: boolean
  readonly completed: number
  readonly errors: number
  /** Over the last progress interval. */
  readonly rps: number
  readonly chunksPerSecond: number
  readonly inFlight: number
  readonly e2eP50Millis: number
}

export interface RunHooks {
  readonly onProgress?: ((progress: Progress) => void) | undefined
  readonly progressMillis?: number | undefined
  /** Ends the run early; what was measured so far is reported. */
  readonly signal?: AbortSignal | undefined
  /** Called at the start and the end of the measured window (after warm-up). */
  readonly onWindow?: ((edge: "start" | "end") => void) | undefined
  readonly label?: string | undefined
}

export const requestBody = (options: LoadOptions): string =>
  JSON.stringify({
    model: options.model,
    messages: [{ role: "user", content: options.prompt }],
    ...(options.maxTokens === undefined ? {} : { max_tokens: options.maxTokens }),
    ...(options.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    ...options.extra,
  })

/** mulberry32: a small seeded generator, so that an open loop's arrivals repeat run after run. */
export const seededRandom = (seed: number) => {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

const ENDED = Symbol("run ended")

export const run = async (options: LoadOptions, hooks: RunHooks = {}): Promise<LoadResult> => {
  const startedAt = new Date()
  const client = makeClient(options.client, {
    endpoint: options.url,
    key: options.key,
    body: requestBody(options),
    connections: options.concurrency,
    timeoutMillis: options.timeoutMillis,
    headers: options.headers,
  })
  const loopDelay = monitorEventLoopDelay({ resolution: 5 })
  loopDelay.enable()
  const start = performance.now()
  const recorder = new Recorder(
    start,
    start + options.warmupMillis,
    start + options.warmupMillis + options.durationMillis,
    options.slo,
  )
  const inFlight = new Set<AbortController>()
  let maxInFlight = 0
  let stopping = false
  let completed = 0
  let errors = 0
  // Requests past their first token and not yet ended: open streams that actually flow.
  let streaming = 0
  let atEnd = { inFlight: 0, streaming: 0 }
  const token = (now: number, gapMillis: number | undefined) => {
    if (gapMillis === undefined) streaming++
    recorder.token(now, gapMillis)
  }
  let cpuAtWindow = process.cpuUsage()
  let cpuMicros = 0

  const launch = async (scheduled: number): Promise<void> => {
    const controller = new AbortController()
    const timer = setTimeout(() => controller.abort("timeout"), options.timeoutMillis)
    inFlight.add(controller)
    if (inFlight.size > maxInFlight) maxInFlight = inFlight.size
    const exchange = new Exchange(scheduled, token)
    let outcome: Outcome
    try {
      await client.send(exchange, controller.signal)
      outcome = exchange.finish(performance.now())
    } catch (error) {
      if (controller.signal.reason === ENDED) return
      outcome = exchange.fail(
        error,
        performance.now(),
        controller.signal.reason === "timeout" ? "client_timeout" : undefined,
      )
    } finally {
      clearTimeout(timer)
      inFlight.delete(controller)
      if (exchange.streaming) streaming--
    }
    if (outcome.ok) completed++
    else errors++
    recorder.record(outcome)
  }

  let endRun: () => void = () => {}
  const ended = new Promise<void>((resolve) => {
    endRun = resolve
  })
  const stop = () => {
    if (stopping) return
    stopping = true
    const now = performance.now()
    if (now < recorder.windowEndMillis) recorder.windowEndMillis = Math.max(recorder.windowStartMillis, now)
    cpuMicros = now <= recorder.windowStartMillis ? 0 : cpuSince(cpuAtWindow)
    atEnd = { inFlight: inFlight.size, streaming }
    hooks.onWindow?.("end")
    for (const controller of inFlight) controller.abort(ENDED)
    endRun()
  }
  const windowStart = setTimeout(() => {
    cpuAtWindow = process.cpuUsage()
    hooks.onWindow?.("start")
  }, options.warmupMillis)
  const windowEnd = setTimeout(stop, options.warmupMillis + options.durationMillis)
  hooks.signal?.addEventListener("abort", stop, { once: true })

  let last = { at: start, completed: 0, chunks: 0 }
  const chunksSoFar = () => recorder.series.reduce((sum, b) => sum + b.chunks, 0)
  const progress =
    hooks.onProgress === undefined
      ? undefined
      : setInterval(() => {
          const now = performance.now()
          const chunks = chunksSoFar()
          const seconds = Math.max(0.001, (now - last.at) / 1000)
          hooks.onProgress?.({
            elapsedMillis: now - start,
            totalMillis: options.warmupMillis + options.durationMillis,
            warmingUp: now < recorder.windowStartMillis,
            completed,
            errors,
            rps: (completed - last.completed) / seconds,
            chunksPerSecond: (chunks - last.chunks) / seconds,
            inFlight: inFlight.size,
            e2eP50Millis: recorder.e2e.percentile(50) / 1e6,
          })
          last = { at: now, completed, chunks }
        }, hooks.progressMillis ?? 1000)

  const tasks = new Set<Promise<void>>()
  const track = (task: Promise<void>) => {
    tasks.add(task)
    void task.finally(() => tasks.delete(task))
  }

  if (options.rate === undefined) {
    const ramp = options.rampMillis ?? 0
    const worker = async (delay: number) => {
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay))
      while (!stopping) await launch(performance.now())
    }
    for (let i = 0; i < options.concurrency; i++) track(worker((i * ramp) / options.concurrency))
  } else {
    const random = seededRandom(options.seed)
    const gapMillis = () => (-Math.log(1 - random()) * 1000) / options.rate!
    const backlog: Array<number> = []
    let next = start
    const arrive = (scheduled: number) => {
      const task = launch(scheduled).then(() => {
        const due = backlog.shift()
        if (due !== undefined && !stopping) arrive(due)
      })
      track(task)
    }
    const tick = () => {
      if (stopping) return
      const now = performance.now()
      while (next <= now) {
        if (inFlight.size < options.concurrency) arrive(next)
        else backlog.push(next)
        next += gapMillis()
      }
      setTimeout(tick, Math.max(0, next - performance.now()))
    }
    tick()
  }

  await ended
  while (tasks.size > 0) await Promise.allSettled([...tasks])
  clearTimeout(windowStart)
  clearTimeout(windowEnd)
  if (progress !== undefined) clearInterval(progress)
  loopDelay.disable()
  await client.close()
  return summarize(recorder, {
    options,
    label: hooks.label,
    startedAt,
    cpuMicros,
    loopDelayP99Millis: loopDelay.percentile(99) / 1e6,
    maxInFlight,
    atEnd,
  })
}

const cpuSince = (before: NodeJS.CpuUsage): number => {
  const used = process.cpuUsage(before)
  return used.user + used.system
}
