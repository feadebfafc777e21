/**
 * The `single` strategy: one node answers. The node is the cheaper of two
 * random free ones (load and recent latency); a node failing before its
 * first token is replaced invisibly; when the first token is later than the
 * node's recent p95, a second node is started and whichever produces a token
 * first wins, the other is cancelled.
 *
 * Written as a small state machine on the request's own fiber: attempts run
 * their first pull on a detached fiber each and post what happened to an
 * inbox; one alarm covers the hedge and every first-token limit. No queue,
 * race, timeout or fork-join per request.
 */
import type { CapacityExhausted, UpstreamError } from "@swarmgate/protocol"
import { type Chunk, Effect, type Exit, type Option, type Scope } from "effect"
import {
  type Attempt,
  alarmOn,
  classify,
  close,
  ended,
  launchNow,
  modelRequest,
  sourcesIn,
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

// Declared once, not made per call: a generator closure per request keeps all it captures out of
// young collections (gateway/HttpServer.ts, BENCHMARKS.md "Found and fixed").
function* singleBody(
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  scope: Scope.Scope,
) {
  const { pool } = ctx
  const { firstTokenTimeoutMillis, idleTimeoutMillis } = ctx.attempt
  const fiber = yield* sourcesIn(scope)
  const { scope: parent, now: clockNow } = fiber
  const alarm = alarmOn(fiber)
  // Images go only to nodes that can see them.
  const vision = request.messages.some((m) => m.images.length > 0)
  const tried = new Set<string>()

  // The inbox: attempts and the alarm post here, this fiber reads.
  const inbox: Array<Report> = []
  let wake: (() => void) | undefined
  const post = (report: Report) => {
    inbox.push(report)
    const w = wake
    wake = undefined
    w?.()
  }
  const forget = () => {
    wake = undefined
  }
  const nextReport: Effect.Effect<Report> = Effect.suspend(() =>
    inbox.length > 0
      ? Effect.succeed(inbox.shift()!)
      : Finalizers.asyncIn<Report>(parent, (resume) => {
          // The fiber may have yielded since the check: a report can be waiting already.
          if (inbox.length > 0) {
            resume(Effect.succeed(inbox.shift()!))
            return undefined
          }
          wake = () => resume(Effect.succeed(inbox.shift()!))
          return forget
        }),
  )

  let running: Array<Attempt> = []
  // At most one hedge per request, timed from the start of the attempt it backs up.
  let hedged = false
  let hedgeAt: number | undefined
  let alarmAt: number | undefined
  let cancelAlarm: () => void = () => undefined
  const stopAlarm = () => {
    cancelAlarm()
    alarmAt = undefined
  }
  /** One alarm for the earliest of the hedge and the attempts' first-token limits. */
  const arm = (now: number) => {
    let due = hedged ? undefined : hedgeAt
    if (firstTokenTimeoutMillis > 0)
      for (const attempt of running) {
        const limit = attempt.startedAt + firstTokenTimeoutMillis
        if (due === undefined || limit < due) due = limit
      }
    if (due === alarmAt) return
    stopAlarm()
    if (due === undefined) return
    alarmAt = due
    cancelAlarm = alarm(Math.max(0, due - now), () => {
      alarmAt = undefined
      post({ _tag: "Alarm" })
    })
  }
  // A request that ends (or is interrupted) stops its alarm and first pulls still running.
  Finalizers.addNow(parent, () => {
    stopAlarm()
    for (const attempt of running) attempt.cancel()
  })

  const report = (attempt: Attempt, exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) =>
    post({ _tag: "Done", attempt, exit })
  /** A launched attempt starts running: its hedge and first-token limit armed, its node begun. */
  const began = (attempt: Attempt, now: number) => {
    running.push(attempt)
    if (!hedged) {
      const delay = hedgeDelay(ctx, preset, attempt.slot.entry, now)
      hedgeAt = delay === undefined ? undefined : now + delay
    }
    arm(now)
    attempt.begin()
    return attempt
  }
  const launchOn = (slot: Slot) => {
    tried.add(slot.entry.node.id)
    const now = clockNow()
    const launched = launchNow(
      pool,
      parent,
      fiber,
      slot,
      modelRequest(slot.entry, preset, request, idleTimeoutMillis),
      now,
      report,
    )
    return Effect.isEffect(launched)
      ? Effect.map(launched, (attempt) => began(attempt, now))
      : began(launched, now)
  }
  /**
   * An attempt on a node free right now, by plain calls (an Effect only for a
   * node opened by Effect); undefined when none is free.
   */
  const startNow = () => {
    const slot = pool.claimNow(pool.serving(preset.id), tried, vision, fiber.draw(), fiber.draw(), clockNow())
    return slot === undefined ? undefined : launchOn(slot)
  }
  /** `startNow`, else waiting up to `waitMillis` in the dispatch queue for a node to come free. */
  const start = (waitMillis: number): Attempt | Effect.Effect<Attempt | undefined> | undefined =>
    startNow() ??
    (waitMillis <= 0
      ? undefined
      : pool.claim(
          preset.id,
          tried,
          vision,
          waitMillis,
          (slot) => {
            const launched = launchOn(slot)
            return Effect.isEffect(launched) ? launched : Effect.succeed(launched)
          },
          fiber,
          true,
        ))

  /** An attempt that failed before its first token: noted, freed; the next one starts if attempts remain. */
  const failed = (attempt: Attempt, failure: NodeFailure, at: number) =>
    Effect.suspend(() => {
      running = running.filter((a) => a !== attempt)
      attempt.slot.entry.health.failure(at, failure.reason, attempt.slot.trial)
      return close(attempt)
    })

  const first = yield* started(start(ctx.queueWaitMillis))
  if (first === undefined) return yield* Effect.fail(capacityExhausted(ctx, preset))
  let launched = 1

  while (true) {
    const next = yield* nextReport
    const at = clockNow()

    if (next._tag === "Alarm") {
      // Reports due at the same instant as the alarm (a test clock's tie) go first.
      if (!next.deferred && inbox.length > 0) {
        post({ _tag: "Alarm", deferred: true })
        continue
      }
      for (const attempt of [...running]) {
        if (firstTokenTimeoutMillis > 0 && at - attempt.startedAt >= firstTokenTimeoutMillis)
          yield* failed(attempt, timedOut(attempt.slot.entry, "no first token", firstTokenTimeoutMillis), at)
      }
      if (!hedged && hedgeAt !== undefined && at >= hedgeAt && running.length > 0) {
        hedged = true
        const backed = [...running]
        // Only a node free right now: a hedge never waits in the queue.
        const hedge = yield* started(start(0))
        if (hedge !== undefined) for (const attempt of backed) attempt.slot.entry.hedges++
      }
      arm(at)
      if (running.length > 0) continue
    } else {
      const { attempt } = next
      // A report from an attempt already given up on.
      if (!running.includes(attempt)) continue
      const outcome = classify(attempt.slot.entry.node.id, next.exit)
      if (outcome._tag !== "Failed") {
        running = running.filter((a) => a !== attempt)
        stopAlarm()
        // The winner: the others are cancelled, their slots freed, their lateness noted.
        for (const loser of running) {
          loser.slot.entry.health.slow(at - loser.startedAt)
          yield* close(loser)
        }
        running = []
        attempt.slot.entry.health.firstToken(at - attempt.startedAt, attempt.slot.trial)
        if (outcome._tag === "Empty") {
          // The node ended its stream without any event: an empty answer.
          attempt.slot.entry.health.succeeded()
          return runOf(attempt.slot.entry.node.id, ended)
        }
        const won = yield* winner(attempt, at, outcome.chunk, idleTimeoutMillis, clockNow)
        return runOf(attempt.slot.entry.node.id, won.pull, won.next)
      }
      yield* failed(attempt, outcome.failure, at)
      if (running.length > 0) continue
    }

    // Nothing runs any more: a replacement while attempts last.
    if (launched < ctx.maxAttempts) {
      launched++
      const replacement = yield* started(start(ctx.queueWaitMillis))
      if (replacement !== undefined) continue
    }
    stopAlarm()
    // Nothing was generated: no node could start it, which is capacity (429), not a failure (502).
    return yield* Effect.fail(capacityExhausted(ctx, preset, clockNow()))
  }
}

/** The strategy in `scope`: what the request acquires (slots, node streams, its alarm) is released there. */
export const single = (
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  scope: Scope.Scope,
): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError> =>
  Effect.gen(() => singleBody(ctx, preset, request, scope))
