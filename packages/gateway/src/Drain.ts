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
import { renderError, ServerDraining, streamErrorEvent } from "@swarmgate/protocol"
import { SseEncoder } from "@swarmgate/sse"
import { Effect, Fiber } from "effect"
import { constVoid } from "effect/Function"

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
  res.writeHead(rendered.status, {
    ...rendered.headers,
    connection: "close",
    "content-length": String(Buffer.byteLength(rendered.body)),
  })
  res.end(rendered.body)
}

/**
 * A request the drain follows. The running ones are linked to each other (a
 * doubly linked list from the newest), not kept in a Map or Set: with one Map
 * entry per request keyed by its fiber, a JSON request promoted ~9.8 KiB to
 * the old generation at 32 connections instead of ~4, and cost 6–8 % more CPU
 * (BENCHMARKS.md, 2026-11-28 evening). A Set of these records, or a Map keyed
 * by the response, did the same; the list does not, though its nodes hold the
 * same fiber and response. That was with Effect's own table of root fibers
 * in place: with it switched off (RootFibers.ts, as the server does) a Map
 * here promotes no more than the list (0.85 KiB both), so it is the two
 * tables together that cost. The list stays for programs that keep
 * `Fiber.roots`.
 */
interface Tracked {
  readonly fiber: Fiber.RuntimeFiber<unknown, unknown>
  readonly res: ServerResponse
  readonly requestId: string
  readonly onEnded: (code: string) => void
  prev: Tracked | undefined
  next: Tracked | undefined
}

export class Drainer {
  /** SIGTERM received: unready, refusing new requests. */
  draining = false
  /** The deadline passed: what still runs is being ended. */
  expired = false
  /** The most recently tracked request still running; the others follow through `next`. */
  private newest: Tracked | undefined = undefined
  private count = 0
  private readonly idleWaiters = new Set<() => void>()
  private readonly halts = new Set<() => void>()

  get inFlight(): number {
    return this.count
  }

  /** Follows a request's fiber until it exits. `onEnded` hears how the drain ended it, if it did. */
  track(
    fiber: Fiber.RuntimeFiber<unknown, unknown>,
    res: ServerResponse,
    requestId: string,
    onEnded: (code: string) => void = constVoid,
  ) {
    const node: Tracked = { fiber, res, requestId, onEnded, prev: undefined, next: this.newest }
    if (this.newest !== undefined) this.newest.prev = node
    this.newest = node
    this.count++
    fiber.addObserver(() => {
      this.unlink(node)
      if (this.count === 0) for (const wake of this.idleWaiters) wake()
    })
  }

  private unlink(node: Tracked) {
    // A fiber's observers run once, so this is defence: a node already out (only the newest has no
    // `prev`, and `prev`/`next` are cleared below) must stay out and leave the count alone.
    if (node.prev === undefined && this.newest !== node) return
    if (node.prev === undefined) this.newest = node.next
    else node.prev.next = node.next
    if (node.next !== undefined) node.next.prev = node.prev
    node.prev = undefined
    node.next = undefined
    this.count--
  }

  /** The requests still running, newest first. */
  private stillRunning(): Array<Tracked> {
    const left: Array<Tracked> = []
    for (let node = this.newest; node !== undefined; node = node.next) left.push(node)
    return left
  }

  private idle(millis: number) {
    return Effect.promise<void>(
      () =>
        new Promise((resolve) => {
          if (this.count === 0) return resolve()
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
    this.halts.add(halt)
    return () => {
      this.halts.delete(halt)
    }
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
      if (self.count > 0) {
        yield* Effect.logInfo(
          `draining: ${self.count} request(s) in flight may finish within ${drainMillis} ms`,
        )
        yield* self.idle(drainMillis)
      }
      if (self.count > 0) {
        self.expired = true
        yield* Effect.logWarning(`draining: deadline reached, ending ${self.count} request(s)`)
        const halts = [...self.halts]
        self.halts.clear()
        for (const halt of halts) halt()
        yield* self.idle(HALT_GRACE_MILLIS)
      }
      if (self.count > 0) {
        const left = self.stillRunning()
        // The shutdown runs uninterruptibly: only an interruptible wait can be cut by the timeout.
        yield* Fiber.interruptAll(left.map(({ fiber }) => fiber)).pipe(
          Effect.interruptible,
          Effect.timeout(INTERRUPT_GRACE_MILLIS),
          Effect.ignore,
        )
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
