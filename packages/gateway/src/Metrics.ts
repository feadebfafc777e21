/**
 * Prometheus metrics (prom-client), served as text on `GET /metrics`.
 *
 * The hot path only increments pre-bound children: label values come from
 * small closed sets (preset ids, HTTP statuses, catalogue codes), and each
 * combination's child is bound once and cached. Node states and dependency
 * figures are read when scraped or by the background probe, never per request.
 */
import { Dispatcher } from "@swarmgate/dispatch"
import { Context, Effect, Layer, Option, type Redacted } from "effect"
import { Counter, collectDefaultMetrics, Gauge, Histogram, Registry } from "prom-client"

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

  const requests = new Counter({
    name: "swarmgate_requests_total",
    help: "Finished requests by route, model (preset), HTTP status and error code (empty on success).",
    labelNames: ["route", "model", "status", "code"] as const,
    registers,
  })
  const ttft = new Histogram({
    name: "swarmgate_time_to_first_token_seconds",
    help: "From the request's arrival to the node's first token, chat completions that reached a node.",
    labelNames: ["model"] as const,
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60],
    registers,
  })
  const duration = new Histogram({
    name: "swarmgate_request_duration_seconds",
    help: "From the request's arrival to the end of its response (streams included).",
    labelNames: ["route", "model"] as const,
    buckets: [0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
    registers,
  })
  const tokens = new Counter({
    name: "swarmgate_tokens_total",
    help: "Tokens of settled chat completions, as the gateway counted them (kind: prompt or completion).",
    labelNames: ["model", "kind"] as const,
    registers,
  })
  const charged = new Counter({
    name: "swarmgate_charged_micros_total",
    help: "Money charged to accounts, in micro-dollars (1e-6 USD).",
    labelNames: ["model"] as const,
    registers,
  })
  const refusals = new Counter({
    name: "swarmgate_limiter_refusals_total",
    help: "Chat completions refused by the limiter (rate, quota, concurrency, admission).",
    labelNames: ["code"] as const,
    registers,
  })
  const inFlight = new Gauge({
    name: "swarmgate_requests_in_flight",
    help: "Chat completions admitted by the limiter and not finished, on this instance.",
    registers,
  })
  const queued = new Gauge({
    name: "swarmgate_requests_queued",
    help: "Chat completions waiting for admission (their account's queue), on this instance.",
    registers,
  })
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

  // One bound child per label combination, created on first use.
  const requestChildren = new Map<string, Counter.Internal>()
  const durationChildren = new Map<string, Histogram.Internal<"route" | "model">>()
  const bound = <V>(cache: Map<string, V>, key: string, create: () => V): V => {
    let child = cache.get(key)
    if (child === undefined) {
      child = create()
      cache.set(key, child)
    }
    return child
  }
  const perModel = new Map<
    string,
    {
      ttft: Histogram.Internal<"model">
      prompt: Counter.Internal
      completion: Counter.Internal
      charged: Counter.Internal
    }
  >()

  const observe = (o: Observation) => {
    const status = String(o.status)
    bound(requestChildren, `${o.route}\u0000${o.model}\u0000${status}\u0000${o.code}`, () =>
      requests.labels(o.route, o.model, status, o.code),
    ).inc()
    bound(durationChildren, `${o.route}\u0000${o.model}`, () => duration.labels(o.route, o.model)).observe(
      o.durationSeconds,
    )
    if (LIMITER_CODES.has(o.code)) refusals.labels(o.code).inc()
    if (o.model === "") return
    const m = bound(perModel, o.model, () => ({
      ttft: ttft.labels(o.model),
      prompt: tokens.labels(o.model, "prompt"),
      completion: tokens.labels(o.model, "completion"),
      charged: charged.labels(o.model),
    }))
    if (o.ttftSeconds !== undefined) m.ttft.observe(o.ttftSeconds)
    if (o.costMicros !== undefined) {
      m.prompt.inc(o.promptTokens ?? 0)
      m.completion.inc(o.completionTokens ?? 0)
      m.charged.inc(o.costMicros)
    }
  }

  return {
    registry,
    observe,
    queued: { inc: () => queued.inc(), dec: () => queued.dec() },
    inFlight: { inc: () => inFlight.inc(), dec: () => inFlight.dec() },
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
