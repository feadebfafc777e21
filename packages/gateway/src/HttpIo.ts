/**
 * Plain `node:http` helpers shared by every surface on the server (the
 * request path here, the admin API and pages in `@swarmgate/admin`): empty
 * and JSON answers, bodies within their limits, and the bounded drain of a
 * body that was refused unread.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { Finalizers, Timers } from "@swarmgate/dispatch"
import {
  type ApiError,
  InvalidRequest,
  RequestTimeout,
  RequestTooLarge,
  renderError,
} from "@swarmgate/protocol"
import { Exit, type Scope } from "effect"
import type { GatewayConfigShape } from "./GatewayConfig"

/** An answer without a body, with `allow` (a 405's methods) when given. */
export const empty = (res: ServerResponse, status: number, allow?: string) => {
  res.writeHead(status, allow === undefined ? { "content-length": "0" } : { allow, "content-length": "0" })
  res.end()
}

export const sendJson = (res: ServerResponse, status: number, body: unknown) => {
  const text = JSON.stringify(body)
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
  })
  res.end(text)
}

export const hasBody = (req: IncomingMessage) =>
  req.headers["transfer-encoding"] !== undefined ||
  (req.headers["content-length"] !== undefined && req.headers["content-length"] !== "0")

/** After refusing a body we did not read, how much more of it we read and discard. */
const DRAIN_MAX_BYTES = 1024 * 1024
const DRAIN_MAX_MILLIS = 2_000

/**
 * A refused body is drained for a bounded while, so that a client still
 * uploading can read our answer (closing at once makes it see EPIPE, not the
 * 413): at most `DRAIN_MAX_BYTES` are read, then reading stops, and after
 * `DRAIN_MAX_MILLIS` the connection is cut.
 */
export const closeAfterUnreadBody = (req: IncomingMessage, res: ServerResponse) => {
  if (req.complete || !hasBody(req)) return
  res.once("finish", () => {
    if (req.complete) return
    const socket = req.socket
    // Counted per chunk: on loopback a polling check lets tens of MB through between two ticks.
    let drained = 0
    const cut = () => {
      clearTimeout(timer)
      socket.destroy()
    }
    const timer = setTimeout(cut, DRAIN_MAX_MILLIS)
    timer.unref()
    req.on("data", (chunk: Buffer) => {
      drained += chunk.length
      // Past the bound, stop reading: TCP then stops the client. Cutting here would make a client
      // that is still writing fail on its write and drop the answer it has not read yet.
      if (drained > DRAIN_MAX_BYTES) req.pause()
    })
    req.once("end", () => clearTimeout(timer))
    req.resume()
  })
}

export const isJsonContentType = (value: string | undefined) => {
  if (value === undefined) return false
  const semi = value.indexOf(";")
  return (semi < 0 ? value : value.slice(0, semi)).trim().toLowerCase() === "application/json"
}

/** What a body read ends with: the body as `parse` made it, or the refusal of its size or lateness. */
export type BodyExit<A, E> = Exit.Exit<A, E | RequestTooLarge | RequestTimeout>

/**
 * Reads the whole body within the size limit and the arrival deadline, by
 * callback: `done` gets `parse`'s result once, maybe before this returns.
 * Returns the cleanup (listeners, deadline, chunks), safe to call again;
 * undefined when decided at once.
 */
export const listenBody = <A, E>(
  req: IncomingMessage,
  config: GatewayConfigShape,
  startedAt: number,
  parse: (body: Buffer) => Exit.Exit<A, E>,
  done: (exit: BodyExit<A, E>) => void,
): (() => void) | undefined => {
  const tooLarge = () =>
    new RequestTooLarge({
      message: `The request body exceeds the limit of ${config.maxBodyBytes} bytes.`,
      param: null,
    })
  const declared = req.headers["content-length"]
  if (declared !== undefined && Number(declared) > config.maxBodyBytes) {
    done(Exit.fail(tooLarge()))
    return undefined
  }
  const chunks: Array<Buffer> = []
  let size = 0
  // Kept by the request's scope until it closes: it lets go of the body's chunks.
  const cleanup = () => {
    cancelTimer()
    req.off("data", onData)
    req.off("end", onEnd)
    chunks.length = 0
  }
  const onData = (chunk: Buffer) => {
    size += chunk.length
    if (size > config.maxBodyBytes) {
      cleanup()
      req.pause()
      done(Exit.fail(tooLarge()))
      return
    }
    chunks.push(chunk)
  }
  const onEnd = () => {
    const body = chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size)
    cleanup()
    done(parse(body))
  }
  // One shared list for every body's deadline, counted from the request's arrival.
  const cancelTimer = Timers.deadline(
    config.bodyTimeoutMillis,
    () => {
      cleanup()
      req.pause()
      done(
        Exit.fail(
          new RequestTimeout({
            message: `The request body did not arrive within ${Math.round(config.bodyTimeoutMillis / 1000)} seconds.`,
          }),
        ),
      )
    },
    startedAt,
  )
  req.on("data", onData)
  req.on("end", onEnd)
  return cleanup
}

/** `listenBody` as one wait; with a scope, its cleanup is that scope's. */
const readWith = <A, E>(
  req: IncomingMessage,
  config: GatewayConfigShape,
  startedAt: number,
  scope: Scope.Scope | undefined,
  parse: (body: Buffer) => Exit.Exit<A, E>,
) =>
  Finalizers.asyncIn<A, E | RequestTooLarge | RequestTimeout>(scope, (resume) =>
    listenBody(req, config, startedAt, parse, resume),
  )

/** The body as JSON; an `Exit`, which is an Effect too (no step to run it). */
export const parseJson = (buffer: Buffer): Exit.Exit<unknown, InvalidRequest> => {
  try {
    return Exit.succeed(JSON.parse(buffer.toString("utf8")) as unknown)
  } catch {
    return Exit.fail(new InvalidRequest({ message: "The request body is not valid JSON.", param: null }))
  }
}

/**
 * Reads the whole body within the size limit and the arrival deadline; with
 * the request's scope, its listeners and timer are that scope's cleanup.
 */
export const readBody = (
  req: IncomingMessage,
  config: GatewayConfigShape,
  startedAt: number,
  scope?: Scope.Scope,
) => readWith(req, config, startedAt, scope, Exit.succeed)

/** `readBody` parsed as JSON, in the same wait. */
export const readJson = (
  req: IncomingMessage,
  config: GatewayConfigShape,
  startedAt: number,
  scope?: Scope.Scope,
) => readWith(req, config, startedAt, scope, parseJson)

/**
 * A §7 refusal as the one renderer makes it (status, headers, body with the
 * request id); a refusal that leaves the body unread drains it boundedly.
 */
export const sendError = (req: IncomingMessage, res: ServerResponse, requestId: string, error: ApiError) => {
  const rendered = renderError(error, requestId)
  if (error.status === 413 || error.status === 408 || error.status === 415 || error.status === 401) {
    closeAfterUnreadBody(req, res)
  }
  res.writeHead(rendered.status, rendered.headers)
  res.end(rendered.body)
}

/** The decoded path segments after `prefix`; throws on a malformed percent-escape (the server answers 404). */
export const segmentsAfter = (prefix: string, path: string): ReadonlyArray<string> =>
  path
    .slice(prefix.length)
    .split("/")
    .filter((s) => s.length > 0)
    .map(decodeURIComponent)
