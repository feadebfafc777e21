/**
 * The `single` strategy: one node answers. The node is the cheaper of two
 * random free ones (load and recent latency); a node failing before its
 * first token is replaced invisibly; when the first token is later than the
 * node's recent p95, a second node is started and whichever produces a token
 * first wins, the other is cancelled.
 *
 * Written as a small state machine: attempts (an HTTP node by callback,
 * others on a detached fiber each) post what happened to an inbox; one alarm
 * covers the hedge and every first-token limit. No queue, race, timeout or
 * fork-join per request. The common request (a node free at once, started
 * by callback, whose first event comes before any alarm) runs by plain calls
 * from start to run (`beginSingle`); anything else is the Effect loop's,
 * from the state the plain start left (`singleLoop`).
 */
import type { CapacityExhausted, UpstreamError } from "@swarmgate/protocol"
import { type Chunk, Effect, Exit, type Option, type Runtime, type Scope } from "effect"
import {
  type Attempt,
  alarmOn,
  classify,
  close,
  ended,
  launchNow,
  modelRequest,
  type Sources,
  sourcesIn,
  sourcesOfRuntime,
  timedOut,
  winner,
} from "../Attempt"
import * as Finalizers from "../Finalizers"
import type { Entry, Slot } from "../NodePool"
import type { NodeEvent, NodeFailure, NodeRequest } from "../NodeTransport"
import type { Preset } from "../Presets"
import { capacityExhausted, type NodeRun, runOf, type StrategyContext } from "./Strategy"

type Report =
  | {
      readonly _tag: "Done"
      readonly attempt: Attempt
      readonly exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>
    }
  | { readonly _tag: "Alarm"; readonly deferred?: boolean }

/** When to start a second node: the node's own p95, else the preset's, else the configured default. */
const hedgeDelay = (ctx: StrategyContext, preset: Preset, entry: Entry, now: number): number | undefined => {
  if (ctx.hedgeAfterMillis <= 0) return undefined
  const own = entry.health.p95()
  if (own !== undefined) return Math.max(ctx.hedgeMinMillis, own)
  return Math.max(ctx.hedgeMinMillis, ctx.pool.swarmTtftP95(preset.id, now) ?? ctx.hedgeAfterMillis)
}

/** What `start` gave: an attempt at once, or the Effect that launches (or waits for) one. */
function* started(start: Attempt | Effect.Effect<Attempt | undefined> | undefined) {
  return start === undefined || !Effect.isEffect(start) ? start : yield* start
}

/** A request's single strategy: its attempts, inbox and alarm, driven by the Effect loop or plain calls. */
class SingleRun {
  readonly tried = new Set<string>()
  /** The inbox: attempts and the alarm post here; the loop (or the plain start) reads. */
  readonly inbox: Array<Report> = []
  wake: (() => void) | undefined = undefined
  running: Array<Attempt> = []
  /** At most one hedge per request, timed from the start of the attempt it backs up. */
  hedged = false
  hedgeAt: number | undefined = undefined
  alarmAt: number | undefined = undefined
  cancelAlarm: () => void = () => undefined
  launched = 0
  readonly vision: boolean
  /** With `now`, the request's clock for nodes that wait themselves (`NodeClock`). */
  readonly alarm: ReturnType<typeof alarmOn>
  readonly now: () => number
  readonly nextReport: Effect.Effect<Report>

  constructor(
    readonly ctx: StrategyContext,
    readonly preset: Preset,
    readonly request: Omit<NodeRequest, "model">,
    readonly sources: Sources,
  ) {
    // Images go only to nodes that can see them.
    this.vision = request.messages.some((m) => m.images.length > 0)
    this.alarm = alarmOn(sources)
    this.now = sources.now
    const forget = () => {
      this.wake = undefined
    }
    this.nextReport = Effect.suspend(() =>
      this.inbox.length > 0
        ? Effect.succeed(this.inbox.shift()!)
        : Finalizers.asyncIn<Report>(sources.scope, (resume) => {
            // The fiber may have yielded since the check: a report can be waiting already.
            if (this.inbox.length > 0) {
              resume(Effect.succeed(this.inbox.shift()!))
              return undefined
            }
            this.wake = () => resume(Effect.succeed(this.inbox.shift()!))
            return forget
          }),
    )
    // A request that ends (or is interrupted) stops its alarm and first pulls still running; a
    // report arriving later wakes no one.
    Finalizers.addNow(sources.scope, () => {
      this.wake = undefined
      this.stopAlarm()
      for (const attempt of this.running) attempt.cancel()
    })
  }

  post(report: Report): void {
    this.inbox.push(report)
    const w = this.wake
    this.wake = undefined
    w?.()
  }

  stopAlarm(): void {
    this.cancelAlarm()
    this.alarmAt = undefined
  }

  /** One alarm for the earliest of the hedge and the attempts' first-token limits. */
  arm(now: number): void {
    const { firstTokenTimeoutMillis } = this.ctx.attempt
    let due = this.hedged ? undefined : this.hedgeAt
    if (firstTokenTimeoutMillis > 0)
      for (const attempt of this.running) {
        const limit = attempt.startedAt + firstTokenTimeoutMillis
        if (due === undefined || limit < due) due = limit
      }
    if (due === this.alarmAt) return
    this.stopAlarm()
    if (due === undefined) return
    this.alarmAt = due
    this.cancelAlarm = this.alarm(Math.max(0, due - now), () => {
      this.alarmAt = undefined
      this.post({ _tag: "Alarm" })
    })
  }

  readonly report = (attempt: Attempt, exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) =>
    this.post({ _tag: "Done", attempt, exit })

  /** A launched attempt starts running: its hedge and first-token limit armed, its node begun. */
  began(attempt: Attempt, now: number): Attempt {
    this.running.push(attempt)
    if (!this.hedged) {
      const delay = hedgeDelay(this.ctx, this.preset, attempt.slot.entry, now)
      this.hedgeAt = delay === undefined ? undefined : now + delay
    }
    this.arm(now)
    attempt.begin()
    return attempt
  }

  launchOn(slot: Slot): Attempt | Effect.Effect<Attempt> {
    this.tried.add(slot.entry.node.id)
    const now = this.sources.now()
    const launched = launchNow(
      this.ctx.pool,
      this.sources.scope,
      this.sources,
      slot,
      modelRequest(slot.entry, this.preset, this.request, this.ctx.attempt.idleTimeoutMillis),
      now,
      this.report,
      this,
    )
    return Effect.isEffect(launched)
      ? Effect.map(launched, (attempt) => this.began(attempt, now))
      : this.began(launched, now)
  }

  /**
   * An attempt on a node free right now, by plain calls (an Effect only for a
   * node opened by Effect); undefined when none is free.
   */
  startNow(): Attempt | Effect.Effect<Attempt> | undefined {
    const { pool } = this.ctx
    const { sources } = this
    const slot = pool.claimNow(
      pool.serving(this.preset.id),
      this.tried,
      this.vision,
      sources.draw(),
      sources.draw(),
      sources.now(),
    )
    return slot === undefined ? undefined : this.launchOn(slot)
  }

  /** `startNow`, else waiting up to `waitMillis` in the dispatch queue for a node to come free. */
  start(waitMillis: number): Attempt | Effect.Effect<Attempt | undefined> | undefined {
    return this.startNow() ?? this.waitFor(waitMillis)
  }

  /** Waiting up to `waitMillis` in the dispatch queue (none free now); undefined for no wait. */
  waitFor(waitMillis: number): Effect.Effect<Attempt | undefined> | undefined {
    if (waitMillis <= 0) return undefined
    return this.ctx.pool.claim(
      this.preset.id,
      this.tried,
      this.vision,
      waitMillis,
      (slot) => {
        const launched = this.launchOn(slot)
        return Effect.isEffect(launched) ? launched : Effect.succeed(launched)
      },
      this.sources,
      true,
    )
  }

  /** An attempt that failed before its first token: noted, freed; the next one starts if attempts remain. */
  failed(attempt: Attempt, failure: NodeFailure, at: number): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.running = this.running.filter((a) => a !== attempt)
      attempt.slot.entry.health.failure(at, failure.reason, attempt.slot.trial)
      return close(attempt)
    })
  }

  /** The attempt's first chunk won: the alarm stopped, its speed noted, its events handed over. */
  won(attempt: Attempt, at: number, chunk: Chunk.Chunk<NodeEvent>): NodeRun {
    this.running = this.running.filter((a) => a !== attempt)
    this.stopAlarm()
    attempt.slot.entry.health.firstToken(at - attempt.startedAt, attempt.slot.trial)
    const run = winner(attempt, at, chunk, this.ctx.attempt.idleTimeoutMillis, this.sources.now)
    return runOf(attempt.slot.entry.node.id, run.pull, run.next)
  }
}

// Declared once, not made per call: a generator closure per request keeps all it captures out of
// young collections (gateway/HttpServer.ts, BENCHMARKS.md "Found and fixed").
/** The Effect loop, from `first` (the first start, or nothing when the plain start began it). */
function* loopBody(run: SingleRun, first: Attempt | Effect.Effect<Attempt | undefined> | undefined) {
  const { ctx, preset } = run
  const { firstTokenTimeoutMillis } = ctx.attempt
  const clockNow = run.sources.now
  if (run.launched === 0) {
    if ((yield* started(first)) === undefined) return yield* Effect.fail(capacityExhausted(ctx, preset))
    run.launched = 1
  }

  while (true) {
    const next = yield* run.nextReport
    const at = clockNow()

    if (next._tag === "Alarm") {
      // Reports due at the same instant as the alarm (a test clock's tie) go first.
      if (!next.deferred && run.inbox.length > 0) {
        run.post({ _tag: "Alarm", deferred: true })
        continue
      }
      for (const attempt of [...run.running]) {
        if (firstTokenTimeoutMillis > 0 && at - attempt.startedAt >= firstTokenTimeoutMillis)
          yield* run.failed(
            attempt,
            timedOut(attempt.slot.entry, "no first token", firstTokenTimeoutMillis),
            at,
          )
      }
      if (!run.hedged && run.hedgeAt !== undefined && at >= run.hedgeAt && run.running.length > 0) {
        run.hedged = true
        const backed = [...run.running]
        // Only a node free right now: a hedge never waits in the queue.
        const hedge = yield* started(run.start(0))
        if (hedge !== undefined) for (const attempt of backed) attempt.slot.entry.hedges++
      }
      run.arm(at)
      if (run.running.length > 0) continue
    } else {
      const { attempt } = next
      // A report from an attempt already given up on.
      if (!run.running.includes(attempt)) continue
      const outcome = classify(attempt.slot.entry.node.id, next.exit)
      if (outcome._tag !== "Failed") {
        run.running = run.running.filter((a) => a !== attempt)
        run.stopAlarm()
        // The winner: the others are cancelled, their slots freed, their lateness noted.
        for (const loser of run.running) {
          loser.slot.entry.health.slow(at - loser.startedAt)
          yield* close(loser)
        }
        run.running = []
        if (outcome._tag === "First") return run.won(attempt, at, outcome.chunk)
        attempt.slot.entry.health.firstToken(at - attempt.startedAt, attempt.slot.trial)
        // The node ended its stream without any event: an empty answer.
        attempt.slot.entry.health.succeeded()
        return runOf(attempt.slot.entry.node.id, ended)
      }
      yield* run.failed(attempt, outcome.failure, at)
      if (run.running.length > 0) continue
    }

    // Nothing runs any more: a replacement while attempts last.
    if (run.launched < ctx.maxAttempts) {
      run.launched++
      const replacement = yield* started(run.start(ctx.queueWaitMillis))
      if (replacement !== undefined) continue
    }
    run.stopAlarm()
    // Nothing was generated: no node could start it, which is capacity (429), not a failure (502).
    return yield* Effect.fail(capacityExhausted(ctx, preset, clockNow()))
  }
}

const singleLoop = (
  run: SingleRun,
  first: Attempt | Effect.Effect<Attempt | undefined> | undefined,
): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError> => Effect.gen(() => loopBody(run, first))

function* singleBody(
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  scope: Scope.Scope,
) {
  const run = new SingleRun(ctx, preset, request, yield* sourcesIn(scope))
  return yield* singleLoop(run, run.start(ctx.queueWaitMillis))
}

/** The strategy in `scope`: what the request acquires (slots, node streams, its alarm) is released there. */
export const single = (
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  scope: Scope.Scope,
): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError> =>
  Effect.gen(() => singleBody(ctx, preset, request, scope))

/** What a plain start hands on: the run as an `Exit` when it came by plain calls, else the Effect that goes on. */
export type Begun = (result: Effect.Effect<NodeRun, CapacityExhausted | UpstreamError>) => void

/**
 * `single` by plain calls, on no fiber (`runtime` runs what needs one): a node free now and
 * started by callback whose first event comes first gives `done` the run as
 * an `Exit` (no Effect step at all); anything else — no free node, a node
 * opened by Effect, a failure, an empty answer, the alarm — gives it the
 * Effect loop that goes on from there. `done` is called once, perhaps
 * before this returns.
 */
export const beginSingle = (
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  scope: Scope.Scope,
  runtime: Runtime.Runtime<never>,
  done: Begun,
): void => {
  const run = new SingleRun(ctx, preset, request, sourcesOfRuntime(scope, runtime))
  const first = run.startNow()
  if (first === undefined || Effect.isEffect(first)) {
    done(singleLoop(run, first ?? run.waitFor(ctx.queueWaitMillis)))
    return
  }
  run.launched = 1
  const onReport = () => {
    const next = run.inbox[0]!
    if (next._tag === "Done" && run.running.length === 1 && run.running[0] === next.attempt) {
      let won: NodeRun
      try {
        const outcome = classify(next.attempt.slot.entry.node.id, next.exit)
        if (outcome._tag !== "First") {
          done(singleLoop(run, undefined))
          return
        }
        run.inbox.shift()
        won = run.won(next.attempt, run.sources.now(), outcome.chunk)
      } catch (thrown) {
        // In the node's callback: a throw is the request's defect, not the transport's.
        done(Exit.die(thrown))
        return
      }
      done(Exit.succeed(won))
      return
    }
    // The report waits in the inbox for the loop.
    done(singleLoop(run, undefined))
  }
  if (run.inbox.length > 0) onReport()
  else run.wake = onReport
}
