/**
 * Graceful drain, the shutdown sequence of one instance (SIGTERM →
 * `NodeRuntime.runMain` interrupts the main fiber → the server's scope
 * closes → `shutdown` below, before any service layer is released):
 *
 * 1. At once: `/readyz` answers 503, the listening socket closes (new
 *    connections go to other instances), and a request arriving on a
 *    connection that is already open gets 503 `server_draining` with
 *    `Retry-After` and `Connection: close`.
 * 2. Requests in flight — streams included — run on, for up to `drainMillis`.
 * 3. At the deadline, streams still running are failed: each ends with the
 *    final SSE error event (a non-streamed one with 502 `upstream_error`) and
 *    is settled as usual for what ran. Requests that have not started are
 *    interrupted and answered 503 `server_draining`; nothing is charged.
 * 4. Every connection is closed. Then the layers close: billing waits for
 *    the last settlements and writes the ledger; the process exits 0.
 */
import type { Server, ServerResponse } from "node:http"
import { Server as NetServer } from "node:net"
import { LinkedSet, renderError, ServerDraining, streamErrorEvent } from "@swarmgate/protocol"
import { SseEncoder } from "@swarmgate/sse"
import { Effect, Fiber } from "effect"
import { constVoid } from "effect/Function"
import type { RequestRun } from "./RequestRun"

/** After the deadline, how long failed streams get to write their last event and settle. */
const HALT_GRACE_MILLIS = 1_000
/** Then, how long interrupted requests get to run their finalizers (settle, release). */
const INTERRUPT_GRACE_MILLIS = 2_000

const sleep = (millis: number) => Effect.promise(() => new Promise((r) => setTimeout(r, millis)))

export const drainingError = (retryAfterSeconds = 5) =>
  new ServerDraining({
    message: "This server is shutting down and takes no new requests; retry, another instance will answer.",
    retryAfterSeconds,
  })

/** Writes the 503 `server_draining` answer; the connection closes after it. */
export const refuse = (res: ServerResponse, requestId: string) => {
  const rendered = renderError(drainingError(), requestId)
  rendered.headers.connection = "close"
  res.writeHead(rendered.status, rendered.headers)
  res.end(rendered.body)
}

/**
 * A request the drain follows. The running ones, and the halts of running
 * answers, are kept in linked sets (protocol/LinkedSet.ts says why not a Map
 * or Set: a long-lived hash table under per-request churn keeps requests
 * alive through young collections; here a Map keyed by the fiber cost 6–8 %
 * CPU per request while Effect's own root-fiber Set was on, BENCHMARKS.md,
 * 2026-11-28 evening; with it off, as the server runs, no difference was
 * measured).
 */
interface Tracked {
  readonly run: RequestRun
  readonly res: ServerResponse
  readonly requestId: string
  readonly onEnded: (code: string) => void
}

export class Drainer {
  /** SIGTERM received: unready, refusing new requests. */
  draining = false
  /** The deadline passed: what still runs is being ended. */
  expired = false
  private readonly running = new LinkedSet<Tracked>()
  private readonly idleWaiters = new Set<() => void>()
  private readonly halts = new LinkedSet<() => void>()

  get inFlight(): number {
    return this.running.size
  }

  /** Follows a request until it ends. `onEnded` hears how the drain ended it, if it did. */
  track(
    run: RequestRun,
    res: ServerResponse,
    requestId: string,
    onEnded: (code: string) => void = constVoid,
  ) {
    const link = this.running.add({ run, res, requestId, onEnded })
    run.addObserver(() => {
      this.running.remove(link)
      if (this.running.size === 0) for (const wake of this.idleWaiters) wake()
    })
  }

  private idle(millis: number) {
    return Effect.promise<void>(
      () =>
        new Promise((resolve) => {
          if (this.running.size === 0) return resolve()
          const done = () => {
            clearTimeout(timer)
            this.idleWaiters.delete(done)
            resolve()
          }
          const timer = setTimeout(done, millis)
          this.idleWaiters.add(done)
        }),
    )
  }

  /**
   * Registers `halt`, called at the drain deadline to fail a running answer
   * through its ordinary failure path (final event, settlement). Returns its
   * removal. Called at once if the deadline already passed.
   */
  onHalt(halt: () => void): () => void {
    if (this.expired) {
      halt()
      return constVoid
    }
    const link = this.halts.add(halt)
    return () => this.halts.remove(link)
  }

  /** The sequence above, for `server`; completes when every connection is closed. */
  shutdown(server: Server, drainMillis: number): Effect.Effect<void> {
    const self = this
    return Effect.gen(function* () {
      self.draining = true
      // net.Server's close, not http.Server's: stop accepting, but keep the open keep-alive
      // connections, so that a request already on its way over one gets 503 server_draining
      // (and `Connection: close`) instead of a reset; idle ones still end at the keep-alive timeout.
      const closed = Effect.promise<void>(
        () => new Promise((resolve) => NetServer.prototype.close.call(server, () => resolve())),
      )
      const closing = yield* Effect.fork(closed)
      if (self.inFlight > 0) {
        yield* Effect.logInfo(
          `draining: ${self.inFlight} request(s) in flight may finish within ${drainMillis} ms`,
        )
        yield* self.idle(drainMillis)
      }
      if (self.inFlight > 0) {
        self.expired = true
        yield* Effect.logWarning(`draining: deadline reached, ending ${self.inFlight} request(s)`)
        const halts = self.halts.values()
        self.halts.clear()
        for (const halt of halts) halt()
        yield* self.idle(HALT_GRACE_MILLIS)
      }
      if (self.inFlight > 0) {
        const left = self.running.values()
        for (const { run } of left) run.interrupt()
        yield* self.idle(INTERRUPT_GRACE_MILLIS)
        for (const { res, requestId, onEnded } of left) {
          if (res.writableEnded || res.destroyed) continue
          if (!res.headersSent) {
            onEnded("server_draining")
            refuse(res, requestId)
          } else {
            onEnded("upstream_error")
            res.end(
              SseEncoder.encodeData(
                streamErrorEvent(
                  {
                    message: "The server shut down before the answer was complete.",
                    type: "server_error",
                    code: "upstream_error",
                  },
                  requestId,
                ),
              ),
            )
          }
        }
        yield* sleep(50)
      }
      server.closeAllConnections()
      yield* Fiber.join(closing).pipe(Effect.interruptible, Effect.timeout(1_000), Effect.ignore)
    })
  }
}
