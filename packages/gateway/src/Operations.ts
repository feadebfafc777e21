/**
 * The operational side of the HTTP surface, wired in by `HttpServer`:
 * `/readyz` and `/metrics`, refusals while draining, and per request the
 * metrics and the structured log line. Without an `Operations` (a bare
 * `makeListener`, as tests use it) every hook here is a no-op.
 *
 * `/metrics` is served to a scrape that sends `SWARMGATE_METRICS_TOKEN` as a
 * bearer token, or, when no token is configured, only to loopback clients;
 * anyone else gets 404.
 */
import { timingSafeEqual } from "node:crypto"
import type { IncomingMessage, ServerResponse } from "node:http"
import type { Principal } from "@swarmgate/auth"
import type { Billing } from "@swarmgate/billing"
import type { Quota } from "@swarmgate/quota"
import { Effect, FiberRef, Option, Redacted } from "effect"
import type * as ChatCompletions from "./ChatCompletions"
import { Drainer, refuse } from "./Drain"
import { Health, type HealthShape } from "./Health"
import { Metrics, type MetricsShape } from "./Metrics"
import * as RequestLog from "./RequestLog"
import type { RequestRun } from "./RequestRun"
import { SideRoutes, type SideRoutesShape } from "./SideRoutes"

export interface Operations {
  readonly drainer: Drainer
  /** Routes another package serves outside `/v1` (the admin API), for the drain's route check. */
  readonly side: Option.Option<SideRoutesShape>
  readonly metrics: Option.Option<MetricsShape>
  readonly health: Option.Option<HealthShape>
  readonly log: RequestLog.RequestWriter
}

/** The operations of a server: metrics and health when their layers are present; the log level in force. */
export const make: Effect.Effect<Operations> = Effect.gen(function* () {
  return {
    drainer: new Drainer(),
    side: yield* Effect.serviceOption(SideRoutes),
    metrics: yield* Effect.serviceOption(Metrics),
    health: yield* Effect.serviceOption(Health),
    log: RequestLog.writer(yield* FiberRef.get(FiberRef.currentMinimumLogLevel)),
  }
})

interface Context {
  readonly ops: Operations
  readonly record: RequestLog.RequestRecord
  /** Events still awaited before the request is accounted: the response closing, the request ending. */
  pending: number
}

/**
 * A request's accounting, kept on its response: a WeakMap keyed by every
 * response costs the garbage collector (ephemerons) more than one property.
 */
const CONTEXT: unique symbol = Symbol("@swarmgate/gateway/Operations/context")

type WithContext = ServerResponse & { [CONTEXT]?: Context }

const contextOf = (res: ServerResponse): Context | undefined => (res as WithContext)[CONTEXT]

const finish = (ctx: Context, res: ServerResponse) => {
  if (--ctx.pending > 0) return
  const now = Date.now()
  const observation = RequestLog.observation(ctx.record, res, now)
  if (Option.isSome(ctx.ops.metrics)) ctx.ops.metrics.value.observe(observation)
  const log = ctx.ops.log
  if (ctx.record.route === "probe" ? log.probes : log.requests)
    log.write(RequestLog.line(ctx.record, observation, now))
}

const sendJson = (res: ServerResponse, status: number, body: unknown) => {
  const text = JSON.stringify(body)
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
    "cache-control": "no-store",
  })
  res.end(text)
}

const isLoopback = (address: string | undefined) =>
  address === "127.0.0.1" || address === "::1" || address === "::ffff:127.0.0.1"

const bearerMatches = (header: string | undefined, token: Redacted.Redacted) => {
  const expected = Buffer.from(`Bearer ${Redacted.value(token)}`)
  const actual = Buffer.from(header ?? "")
  return expected.length === actual.length && timingSafeEqual(expected, actual)
}

const metricsEndpoint = (metrics: MetricsShape, req: IncomingMessage, res: ServerResponse) => {
  const allowed = Option.match(metrics.token, {
    onNone: () => isLoopback(req.socket.remoteAddress),
    onSome: (token) => bearerMatches(req.headers.authorization, token),
  })
  if (!allowed) {
    res.writeHead(404, { "content-length": "0" })
    return res.end()
  }
  metrics.registry.metrics().then(
    (text) => {
      res.writeHead(200, {
        "content-type": metrics.registry.contentType,
        "content-length": String(Buffer.byteLength(text)),
        "cache-control": "no-store",
      })
      res.end(text)
    },
    () => sendJson(res, 500, { status: "error" }),
  )
}

const readyEndpoint = (ops: Operations, res: ServerResponse) => {
  if (ops.drainer.draining) return sendJson(res, 503, { status: "draining" })
  if (Option.isNone(ops.health)) return sendJson(res, 200, { status: "ready" })
  Effect.runPromise(ops.health.value.readiness).then(
    (readiness) =>
      // A drain may have begun while the checks ran: it wins.
      ops.drainer.draining
        ? sendJson(res, 503, { status: "draining" })
        : sendJson(res, readiness.ready ? 200 : 503, {
            status: readiness.ready ? "ready" : "unready",
            checks: readiness.checks,
          }),
    () => sendJson(res, 503, { status: "unready" }),
  )
}

/** Whether a handler serves `method` on `path` (the routes of HttpServer and the side routes, probes aside). */
const served = (ops: Operations, method: string, path: string) =>
  (path === "/v1/chat/completions" && method === "POST") ||
  (path === "/v1/models" && (method === "GET" || method === "HEAD")) ||
  (Option.isSome(ops.side) && !path.startsWith("/v1/") && ops.side.value.serves(method, path))

/**
 * Starts accounting for a request and answers it when it is operational:
 * `/readyz`, `/metrics`, or any non-probe request while draining (503
 * `server_draining`). Returns true when it answered.
 */
export const intercept = (
  ops: Operations,
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
  startedAt: number,
  path: string,
): boolean => {
  const method = req.method ?? "GET"
  const record = RequestLog.begin(requestId, method, path, startedAt)
  const ctx: Context = { ops, record, pending: 1 }
  ;(res as WithContext)[CONTEXT] = ctx
  res.once("close", () => finish(ctx, res))
  if (path === "/readyz" && (method === "GET" || method === "HEAD")) {
    readyEndpoint(ops, res)
    return true
  }
  if (path === "/metrics" && method === "GET" && Option.isSome(ops.metrics)) {
    metricsEndpoint(ops.metrics.value, req, res)
    return true
  }
  // Spec §4.3: the route check comes first, draining or not: an unknown path is still 404, a wrong
  // method 405; only a request a handler would serve is refused with 503 server_draining.
  if (ops.drainer.draining && served(ops, method, path)) {
    record.code = "server_draining"
    // Read and drop the body: closing on unread bytes would reset the connection before the 503 arrives.
    req.resume()
    refuse(res, requestId)
    return true
  }
  return false
}

/** Follows the request: accounted once it ends too; ended by the drain if it runs past the deadline. */
export const track = (ops: Operations, run: RequestRun, res: ServerResponse) => {
  const ctx = contextOf(res)
  if (ctx === undefined) return
  ctx.pending++
  ops.drainer.track(run, res, ctx.record.requestId, (code) => {
    ctx.record.code = code
  })
  run.addObserver(() => finish(ctx, res))
}

// --- notes along the request path (no-ops without a context) ------------------------------

export const noteError = (res: ServerResponse, code: string) => {
  const ctx = contextOf(res)
  if (ctx !== undefined) ctx.record.code = code
}

export const notePrincipal = (res: ServerResponse, principal: Principal) => {
  const ctx = contextOf(res)
  if (ctx === undefined) return
  ctx.record.accountId = principal.account.id
  ctx.record.keyId = principal.key.id
  ctx.record.keyPrefix = principal.key.prefix
}

export const noteRequest = (
  res: ServerResponse,
  request: {
    readonly preset: { readonly id: string }
    readonly stream: boolean
    readonly promptTokens: number
  },
) => {
  const ctx = contextOf(res)
  if (ctx === undefined) return
  ctx.record.model = request.preset.id
  ctx.record.stream = request.stream
  ctx.record.promptTokens = request.promptTokens
}

/**
 * The admission gauges of one request, as plain calls: `queued` while it
 * waits for admission, then `admitted` (in flight) until `finished`.
 */
export interface Gauges {
  readonly waiting: () => void
  readonly admitted: () => void
  readonly refused: () => void
  readonly finished: () => void
}

const noGauges: Gauges = {
  waiting: () => undefined,
  admitted: () => undefined,
  refused: () => undefined,
  finished: () => undefined,
}

export const gauges = (res: ServerResponse): Gauges => {
  const ctx = contextOf(res)
  if (ctx === undefined || Option.isNone(ctx.ops.metrics)) return noGauges
  const metrics = ctx.ops.metrics.value
  let state: "new" | "waiting" | "admitted" | "done" = "new"
  return {
    waiting: () => {
      if (state !== "new") return
      state = "waiting"
      metrics.queued.inc()
    },
    admitted: () => {
      if (state === "waiting") metrics.queued.dec()
      if (state === "admitted" || state === "done") return
      state = "admitted"
      metrics.inFlight.inc()
    },
    refused: () => {
      if (state === "waiting") metrics.queued.dec()
      state = "done"
    },
    finished: () => {
      if (state === "waiting") metrics.queued.dec()
      if (state === "admitted") metrics.inFlight.dec()
      state = "done"
    },
  }
}

/**
 * The hooks of an answer: at the first token commits `permit` (by a plain
 * call where it was decided in memory) and notes the node and the time, and
 * lets the drain end the answer at its deadline.
 */
export const respondHooks = (
  res: ServerResponse,
  permit: Quota.Permit,
  onRevocation?: ChatCompletions.RespondHooks["onRevocation"],
): ChatCompletions.RespondHooks => {
  // The permit is committed the moment generation starts: failures before leave no count.
  const { commitNow } = permit
  const commit = (): Effect.Effect<void> | undefined => {
    if (commitNow === undefined) return permit.commit
    commitNow()
    return undefined
  }
  const ctx = contextOf(res)
  // One literal with every hook: `{ ...hooks, onRevocation }` per request gave each copy a hidden
  // class of its own (docs/ARCHITECTURE.md, "Object spread").
  if (ctx === undefined) return { onRun: commit, onRevocation }
  const record = ctx.record
  const drainer = ctx.ops.drainer
  return {
    onRun: (run) => {
      record.firstTokenAt = Date.now()
      record.nodeId = run.nodeId
      return commit()
    },
    onHalt: (halt) => drainer.onHalt(halt),
    onStopped: (code) => {
      record.code = code
    },
    onRevocation,
  }
}

/** The settled cost and tokens, for the log. */
export const noteSettled = (
  res: ServerResponse,
  settlement: Billing.Settlement,
  entry: { readonly costMicros: number } | undefined,
) => {
  const ctx = contextOf(res)
  if (ctx === undefined) return
  ctx.record.outcome = settlement.outcome
  ctx.record.completionTokens = settlement.completionTokens
  if (entry !== undefined) ctx.record.costMicros = entry.costMicros
}
