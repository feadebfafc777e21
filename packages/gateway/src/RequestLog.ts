/**
 * One structured JSON line per request, at level info: who (account, key id
 * and the key's display prefix — never the key), what (model, stream), where
 * it ran (node), how it ended (status, code, outcome), what it cost (tokens,
 * micro-dollars) and how long it took (time to first token, duration).
 *
 * The record is filled in along the request path (see `Operations`) and
 * written once, when both the response is closed and the request has ended
 * (its fiber, or its plain run), so that settlement — the cost — is in it.
 * Lines go straight to stdout: a log line per request is on the hot path, and
 * a direct write of one small JSON object is the cheapest honest way.
 */
import { writeSync } from "node:fs"
import type { ServerResponse } from "node:http"
import { LogLevel } from "effect"
import type { Observation } from "./Metrics"

export type Route = "chat" | "models" | "admin" | "probe" | "other"

export interface RequestRecord {
  readonly requestId: string
  readonly method: string
  readonly path: string
  readonly route: Route
  /** `Date.now()` when the request arrived. */
  readonly startedAt: number
  accountId?: string
  keyId?: string
  keyPrefix?: string
  model?: string
  stream?: boolean
  nodeId?: string
  firstTokenAt?: number
  promptTokens?: number
  completionTokens?: number
  costMicros?: number
  /** The usage record's outcome: completed, upstream_error, upstream_timeout, client_disconnected. */
  outcome?: string
  /** The wire error code of a refusal or failure. */
  code?: string
}

export const routeOf = (path: string): Route => {
  if (path === "/v1/chat/completions") return "chat"
  if (path === "/v1/models") return "models"
  if (path.startsWith("/admin/")) return "admin"
  if (path === "/healthz" || path === "/readyz" || path === "/metrics") return "probe"
  return "other"
}

export const begin = (requestId: string, method: string, path: string, startedAt: number): RequestRecord => ({
  requestId,
  method,
  path,
  route: routeOf(path),
  startedAt,
})

/** Status as the client saw it: 499 when it went away before any answer (nginx's convention). */
const statusOf = (res: ServerResponse) => (res.headersSent ? res.statusCode : 499)

const codeOf = (record: RequestRecord, status: number) => {
  if (record.code !== undefined) return record.code
  // A stream that started ends with its final error event, code upstream_error.
  if (record.outcome === "upstream_error" || record.outcome === "upstream_timeout") return "upstream_error"
  if (record.outcome === "client_disconnected" || status === 499) return "client_disconnected"
  return ""
}

export const observation = (record: RequestRecord, res: ServerResponse, now: number): Observation => {
  const status = statusOf(res)
  return {
    route: record.route,
    model: record.model ?? "",
    status,
    code: codeOf(record, status),
    durationSeconds: (now - record.startedAt) / 1000,
    ttftSeconds:
      record.firstTokenAt === undefined ? undefined : (record.firstTokenAt - record.startedAt) / 1000,
    promptTokens: record.costMicros === undefined ? undefined : record.promptTokens,
    completionTokens: record.completionTokens,
    costMicros: record.costMicros,
  }
}

/** The JSON line; fields that do not apply are null, so every line has the same shape. */
export const line = (record: RequestRecord, o: Observation, now: number): string =>
  `${JSON.stringify({
    time: new Date(now).toISOString(),
    level: "info",
    msg: "request",
    request_id: record.requestId,
    method: record.method,
    path: record.path,
    status: o.status,
    code: o.code === "" ? null : o.code,
    account_id: record.accountId ?? null,
    key_id: record.keyId ?? null,
    key_prefix: record.keyPrefix ?? null,
    model: record.model ?? null,
    stream: record.stream ?? null,
    node: record.nodeId ?? null,
    outcome: record.outcome ?? null,
    prompt_tokens: record.promptTokens ?? null,
    completion_tokens: record.completionTokens ?? null,
    cost_micros: record.costMicros ?? null,
    ttft_ms: o.ttftSeconds === undefined ? null : Math.round(o.ttftSeconds * 1000),
    duration_ms: Math.round(o.durationSeconds * 1000),
  })}\n`

/** Longest a line waits in the batch. */
const BATCH_MILLIS = 20
/** A batch this large is written at once. */
const BATCH_CHARS = 64 * 1024

let batch = ""
let flushTimer: ReturnType<typeof setTimeout> | undefined
let flushAtExit = false

const flush = () => {
  if (flushTimer !== undefined) clearTimeout(flushTimer)
  flushTimer = undefined
  if (batch.length === 0) return
  const text = batch
  batch = ""
  try {
    // Synchronous, so that nothing is lost when the process exits right after.
    writeSync(1, text)
  } catch {
    // stdout gone (EPIPE): the lines have nowhere to go.
  }
}

/**
 * Stdout in batches: one write per `BATCH_MILLIS` or 64 KiB, not one per
 * request (on a pipe each write is a system call on the request path). The
 * batch is written at exit too.
 */
export const batchedStdout = (text: string) => {
  batch += text
  if (batch.length >= BATCH_CHARS) return flush()
  if (flushTimer === undefined) {
    if (!flushAtExit) {
      flushAtExit = true
      process.once("exit", flush)
    }
    flushTimer = setTimeout(flush, BATCH_MILLIS)
    flushTimer.unref()
  }
}

/** Request lines are info: written when the minimum level lets info through; probes only at debug. */
export const writer = (minimum: LogLevel.LogLevel, out: (text: string) => void = batchedStdout) => ({
  requests: LogLevel.lessThanEqual(minimum, LogLevel.Info),
  probes: LogLevel.lessThanEqual(minimum, LogLevel.Debug),
  write: out,
})

export type RequestWriter = ReturnType<typeof writer>
