/**
 * Prometheus metrics (prom-client), served as text on `GET /metrics`.
 *
 * The hot path only adds to plain numbers (PlainMetrics.ts): label values
 * come from small closed sets (preset ids, HTTP statuses, catalogue codes),
 * and each combination's child is made once, then found by map lookups on
 * the values as they come (no key string or label array per request). Node
 * states and dependency figures are read when scraped or by the background
 * probe, never per request.
 */
import { Dispatcher } from "@swarmgate/dispatch"
import { Context, Effect, Layer, Option, type Redacted } from "effect"
import { collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client"
import { type Buckets, type Cell, CounterFamily, HistogramFamily, PlainGauge } from "./PlainMetrics"

/** What one finished request contributes; see `RequestLog.RequestRecord`. */
export interface Observation {
  readonly route: string
  /** A preset id, or "" before the model is known. */
  readonly model: string
  readonly status: number
  /** The error code (wire catalogue, the stream's final event, `client_disconnected`), "" on success. */
  readonly code: string
  readonly durationSeconds: number
  readonly ttftSeconds: number | undefined
  /** Present when the request reached a node and was settled. */
  readonly promptTokens: number | undefined
  readonly completionTokens: number | undefined
  readonly costMicros: number | undefined
}

export interface MetricsShape {
  readonly registry: Registry
  readonly observe: (observation: Observation) => void
  readonly queued: { readonly inc: () => void; readonly dec: () => void }
  readonly inFlight: { readonly inc: () => void; readonly dec: () => void }
  readonly dependency: (name: "database" | "redis", seconds: number, up: boolean) => void
  /** `SWARMGATE_METRICS_TOKEN`: when set, scrapes must send it as a bearer token. */
  readonly token: Option.Option<Redacted.Redacted>
}

export class Metrics extends Context.Tag("@swarmgate/gateway/Metrics")<Metrics, MetricsShape>() {}

const LIMITER_CODES = new Set(["rate_limit_exceeded", "concurrency_limit_exceeded", "admission_unavailable"])

/** The children one route and model update; those by model alone are shared by every route's series. */
class Series {
  /** `swarmgate_requests_total`, by status, then code. */
  readonly requests = new Map<number, Map<string, Cell>>()
  ttft: Buckets | undefined = undefined
  prompt: Cell | undefined = undefined
  completion: Cell | undefined = undefined
  charged: Cell | undefined = undefined
  constructor(readonly duration: Buckets) {}
}

export interface MetricsOptions {
  readonly token?: Option.Option<Redacted.Redacted> | undefined
  /** Node states at scrape time. */
  readonly nodes?: Effect.Effect<ReadonlyArray<Dispatcher.NodeStatus>> | undefined
  /** Process metrics (CPU, memory, event-loop lag, GC). */
  readonly processMetrics?: boolean | undefined
}

export const make = (options: MetricsOptions = {}): MetricsShape => {
  const registry = new Registry()
  if (options.processMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: "swarmgate_" })
  const registers = [registry]

  // Updated per request: plain families (PlainMetrics.ts), read by the registry when scraped.
  const requests = new CounterFamily(
    "swarmgate_requests_total",
    "Finished requests by route, model (preset), HTTP status and error code (empty on success).",
    ["route", "model", "status", "code"],
    registry,
  )
  const ttft = new HistogramFamily(
    "swarmgate_time_to_first_token_seconds",
    "From the request's arrival to the node's first token, chat completions that reached a node.",
    ["model"],
    [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
    registry,
  )
  const duration = new HistogramFamily(
    "swarmgate_request_duration_seconds",
    "From the request's arrival to the end of its response (streams included).",
    ["route", "model"],
    [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
    registry,
  )
  const tokens = new CounterFamily(
    "swarmgate_tokens_total",
    "Tokens of settled chat completions, as the gateway counted them (kind: prompt or completion).",
    ["model", "kind"],
    registry,
  )
  const charged = new CounterFamily(
    "swarmgate_charged_micros_total",
    "Money charged to accounts, in micro-dollars (1e-6 USD).",
    ["model"],
    registry,
  )
  const refusals = new CounterFamily(
    "swarmgate_limiter_refusals_total",
    "Chat completions refused by the limiter (rate, quota, concurrency, admission).",
    ["code"],
    registry,
  )
  const inFlight = new PlainGauge(
    "swarmgate_requests_in_flight",
    "Chat completions admitted by the limiter and not finished, on this instance.",
    registry,
  )
  const queued = new PlainGauge(
    "swarmgate_requests_queued",
    "Chat completions waiting for admission (their account's queue), on this instance.",
    registry,
  )
  const dependencyLatency = new Histogram({
    name: "swarmgate_dependency_latency_seconds",
    help: "Round trip of a trivial command to the database (SELECT 1) or Redis (PING), from the probe.",
    labelNames: ["dependency"] as const,
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
    registers,
  })
  const dependencyUp = new Gauge({
    name: "swarmgate_dependency_up",
    help: "1 when the last probe of the dependency succeeded.",
    labelNames: ["dependency"] as const,
    registers,
  })
  const nodesFor = options.nodes
  new Gauge({
    name: "swarmgate_nodes",
    help: "Nodes by membership state (active, draining) and circuit (closed, open, half_open).",
    labelNames: ["state", "circuit"] as const,
    registers,
    async collect() {
      this.reset()
      if (nodesFor === undefined) return
      const nodes = await Effect.runPromise(nodesFor)
      for (const node of nodes) this.labels(node.state, node.circuit).inc()
    },
  })

  // Each route and model's children, found by map lookups on the values as they come: no key
  // strings joined and no label arrays made per request (~0.8 KB of each). Let go on any reset.
  const byRoute = new Map<string, Map<string, Series>>()
  for (const family of [requests, ttft, duration, tokens, charged]) family.onReset(() => byRoute.clear())
  const seriesOf = (route: string, model: string): Series => {
    let byModel = byRoute.get(route)
    if (byModel === undefined) {
      byModel = new Map()
      byRoute.set(route, byModel)
    }
    let series = byModel.get(model)
    if (series === undefined) {
      series = new Series(duration.at(`${route}\u0000${model}`, [route, model]))
      byModel.set(model, series)
    }
    return series
  }
  const requestsOf = (series: Series, o: Observation): Cell => {
    let byCode = series.requests.get(o.status)
    if (byCode === undefined) {
      byCode = new Map()
      series.requests.set(o.status, byCode)
    }
    let cell = byCode.get(o.code)
    if (cell === undefined) {
      const status = String(o.status)
      cell = requests.at(`${o.route}\u0000${o.model}\u0000${status}\u0000${o.code}`, [
        o.route,
        o.model,
        status,
        o.code,
      ])
      byCode.set(o.code, cell)
    }
    return cell
  }

  const observe = (o: Observation) => {
    const series = seriesOf(o.route, o.model)
    requestsOf(series, o).value++
    series.duration.observe(o.durationSeconds)
    if (LIMITER_CODES.has(o.code)) refusals.at(o.code, [o.code]).value++
    if (o.model === "") return
    if (o.ttftSeconds !== undefined) {
      series.ttft ??= ttft.at(o.model, [o.model])
      series.ttft.observe(o.ttftSeconds)
    }
    if (o.costMicros !== undefined) {
      series.prompt ??= tokens.at(`${o.model}\u0000prompt`, [o.model, "prompt"])
      series.completion ??= tokens.at(`${o.model}\u0000completion`, [o.model, "completion"])
      series.charged ??= charged.at(o.model, [o.model])
      series.prompt.value += o.promptTokens ?? 0
      series.completion.value += o.completionTokens ?? 0
      series.charged.value += o.costMicros
    }
  }

  return {
    registry,
    observe,
    queued: {
      inc: () => {
        queued.value++
      },
      dec: () => {
        queued.value--
      },
    },
    inFlight: {
      inc: () => {
        inFlight.value++
      },
      dec: () => {
        inFlight.value--
      },
    },
    dependency: (name, seconds, up) => {
      dependencyUp.labels(name).set(up ? 1 : 0)
      if (up) dependencyLatency.labels(name).observe(seconds)
    },
    token: options.token ?? Option.none(),
  }
}

/** Metrics over the dispatcher in context (node states), with an optional scrape token. */
export const layer = (
  token: Option.Option<Redacted.Redacted> = Option.none(),
): Layer.Layer<Metrics, never, Dispatcher.Dispatcher> =>
  Layer.effect(
    Metrics,
    Effect.map(Dispatcher.Dispatcher, (dispatcher) => make({ token, nodes: dispatcher.status })),
  )
