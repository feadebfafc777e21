/**
 * One attempt of a request on one node: open the node's answer, wait for its
 * first event, then hand its events over one pull per chunk, feeding the
 * node's health on the way. Also the alarm the strategies time attempts
 * with: a plain `setTimeout` on the real clock, a sleeping fiber under a
 * test clock (so `TestClock` drives hedges and first-token limits).
 */
import { Tokens } from "@swarmgate/protocol"
import {
  Cause,
  Chunk,
  Clock,
  Context,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  FiberId,
  FiberRefs,
  Option,
  Random,
  Runtime,
  type RuntimeFlags,
  Scope,
} from "effect"
import * as DefaultServices from "effect/DefaultServices"
import * as Finalizers from "./Finalizers"
import { type Entry, type NodePool, openOn, type Slot } from "./NodePool"
import {
  type NodeClock,
  type NodeEvent,
  NodeFailure,
  type NodeNext,
  type NodePull,
  type NodeRequest,
} from "./NodeTransport"
import type { Preset } from "./Presets"

export interface AttemptOptions {
  /** A node that has not produced a first token by then has failed. */
  readonly firstTokenTimeoutMillis: number
  /** A running stream silent this long has failed: `stalled`. */
  readonly idleTimeoutMillis: number
}

/** The request as one node gets it: its own model name and the idle limit. */
export const modelRequest = (
  entry: Entry,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  idleTimeoutMillis: number,
): NodeRequest => ({
  // Field by field, not a spread: one object shape for every request.
  requestId: request.requestId,
  model: entry.node.models.get(preset.id) ?? preset.id,
  messages: request.messages,
  maxTokens: request.maxTokens,
  jsonMode: request.jsonMode,
  sampling: request.sampling,
  idleTimeoutMillis,
})

export const ended: NodePull = Effect.fail(Option.none())

/** Pulls until a chunk holds an event: streams may emit empty chunks. */
export const firstNonEmpty = (pull: NodePull): NodePull =>
  Effect.flatMap(pull, (chunk) => (Chunk.isNonEmpty(chunk) ? Effect.succeed(chunk) : firstNonEmpty(pull)))

export const timedOut = (entry: Entry, what: string, millis: number) =>
  new NodeFailure({ nodeId: entry.node.id, reason: `timeout: ${what} after ${millis} ms` })

/** Runs `effect` with a time limit (0: none). Off the hot path: consensus and judges only. */
export const within =
  <E>(millis: number, onTimeout: () => E) =>
  <A, E2, R>(effect: Effect.Effect<A, E2, R>): Effect.Effect<A, E | E2, R> =>
    millis > 0 ? Effect.timeoutFail(effect, { duration: millis, onTimeout }) : effect

/** The idle limit for nodes that do not enforce it themselves: a timer per pull. */
export const idleLimit = (entry: Entry, idleTimeoutMillis: number) =>
  within(entry.node.enforcesIdleTimeout === true ? 0 : idleTimeoutMillis, () =>
    Option.some(new NodeFailure({ nodeId: entry.node.id, reason: "stalled" })),
  )

// --- the fiber's services, read once ------------------------------------------------------

/** Draws and times a request needs, as plain calls: one read of the fiber's services, not an Effect per use. */
export interface Sources {
  readonly scope: Scope.Scope
  /**
   * The fiber's runtime, built on first use (a test clock's alarm, a node
   * opened on a fiber of its own): reading a fiber's refs updates them, a
   * cost most requests never need.
   */
  readonly runtime: Runtime.Runtime<never>
  readonly clock: Clock.Clock
  /** A uniform draw in [0, 1) from the fiber's `Random` (seeded in tests). */
  readonly draw: () => number
  readonly now: () => number
}

/** Effect's Random has no synchronous draw; its own implementation keeps a PRNG that can be asked directly. */
const drawFrom = (random: Random.Random): (() => number) => {
  const prng = (random as unknown as { readonly PRNG?: { number: () => number } }).PRNG
  return prng !== undefined ? () => prng.number() : () => Effect.runSync(random.next)
}

/** A class, not an object literal with a getter: see `runOf` in strategies/Strategy.ts. */
class FiberSources implements Sources {
  private built: Runtime.Runtime<never> | undefined
  readonly draw: () => number
  readonly now: () => number
  constructor(
    readonly scope: Scope.Scope,
    readonly clock: Clock.Clock,
    random: Random.Random,
    private readonly fiber: { getFiberRefs(): FiberRefs.FiberRefs },
    private readonly context: Context.Context<never>,
    private readonly runtimeFlags: RuntimeFlags.RuntimeFlags,
  ) {
    this.draw = drawFrom(random)
    this.now = () => clock.unsafeCurrentTimeMillis()
  }
  get runtime(): Runtime.Runtime<never> {
    this.built ??= Runtime.make({
      context: this.context,
      fiberRefs: this.fiber.getFiberRefs(),
      runtimeFlags: this.runtimeFlags,
    })
    return this.built
  }
}

/** A runtime's clock and draws, read once per runtime (its default services do not change). */
interface Basis {
  readonly clock: Clock.Clock
  readonly draw: () => number
  readonly now: () => number
}

const bases = new WeakMap<Runtime.Runtime<never>, Basis>()

class RuntimeSources implements Sources {
  readonly clock: Clock.Clock
  readonly draw: () => number
  readonly now: () => number
  constructor(
    readonly scope: Scope.Scope,
    readonly runtime: Runtime.Runtime<never>,
    basis: Basis,
  ) {
    this.clock = basis.clock
    this.draw = basis.draw
    this.now = basis.now
  }
}

/** Sources for code running on no fiber (the gateway's plain request): `runtime`'s services, `scope` given. */
export const sourcesOfRuntime = (scope: Scope.Scope, runtime: Runtime.Runtime<never>): Sources => {
  let basis = bases.get(runtime)
  if (basis === undefined) {
    const services = FiberRefs.getOrDefault(runtime.fiberRefs, DefaultServices.currentServices)
    const clock = Context.get(services, Clock.Clock)
    basis = {
      clock,
      draw: drawFrom(Context.get(services, Random.Random)),
      now: () => clock.unsafeCurrentTimeMillis(),
    }
    bases.set(runtime, basis)
  }
  return new RuntimeSources(scope, runtime, basis)
}

/** The fiber's sources, the request's scope given (the gateway keeps it out of the fiber's context). */
export const sourcesIn = (scope: Scope.Scope): Effect.Effect<Sources> =>
  Effect.withFiberRuntime((fiber, status) => {
    const services = fiber.currentDefaultServices
    return Effect.succeed(
      new FiberSources(
        scope,
        Context.get(services, Clock.Clock),
        Context.get(services, Random.Random),
        fiber,
        fiber.currentContext as Context.Context<never>,
        status.runtimeFlags,
      ),
    )
  })

// --- the alarm --------------------------------------------------------------------------

const realClock = Effect.runSync(Effect.clock)
const MAX_TIMER_MILLIS = 2 ** 31 - 1
const constVoid = () => undefined

/** Calls `fire` after `millis` on `runtime`'s clock; returns the cancel. */
export type Alarm = (millis: number, fire: () => void) => () => void

export const alarmOn = (sources: Pick<Sources, "runtime" | "clock">): Alarm => {
  const { clock } = sources
  if (clock === realClock) {
    return (millis, fire) => {
      // Beyond a timer's range Node fires at once; Effect's sleep of it never ends. So neither here.
      if (!(millis <= MAX_TIMER_MILLIS)) return constVoid
      const timer = setTimeout(fire, millis)
      return () => clearTimeout(timer)
    }
  }
  const runFork = Runtime.runFork(sources.runtime)
  return (millis, fire) => {
    // Cancelled by a flag, not an interrupt: interrupting a fiber inside TestClock's sleep can wedge the test clock.
    let cancelled = false
    runFork(Effect.sleep(millis)).addObserver((exit) => {
      if (!cancelled && Exit.isSuccess(exit)) fire()
    })
    return () => {
      cancelled = true
    }
  }
}

// --- one attempt --------------------------------------------------------------------------

export type FirstOutcome =
  | { readonly _tag: "First"; readonly chunk: Chunk.Chunk<NodeEvent> }
  | { readonly _tag: "Empty" }
  | { readonly _tag: "Failed"; readonly failure: NodeFailure }

/** How waiting for a node's first event ended: an event, the end of its stream, or a failure (defects included). */
export const classify = (
  nodeId: string,
  exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>,
): FirstOutcome => {
  if (Exit.isSuccess(exit)) return { _tag: "First", chunk: exit.value }
  const failure = Cause.failureOption(exit.cause)
  if (Option.isSome(failure)) {
    return Option.isNone(failure.value) ? { _tag: "Empty" } : { _tag: "Failed", failure: failure.value.value }
  }
  return {
    _tag: "Failed",
    failure: new NodeFailure({ nodeId, reason: `defect: ${Cause.pretty(exit.cause).slice(0, 200)}` }),
  }
}

/**
 * An attempt on a held slot, released when it loses or fails, or with the
 * request: its slot (and a node started by callback) in `held`, plain
 * cleanups; the stream of a node opened by Effect in `scope`.
 */
export interface Attempt {
  readonly slot: Slot
  readonly held: Finalizers.Group
  scope: Scope.CloseableScope | undefined
  readonly startedAt: number
  /** Set once the node is open. */
  pull: NodePull | undefined
  /** `pull` by callback, for nodes started by callback. */
  next: NodeNext | undefined
  /** Interrupts the attempt's first pull if it still runs. */
  cancel: () => void
  /** The first pull has reported. */
  reported: boolean
  /** Starts the open and the first pull (after the caller armed its alarm: on a test clock, ties go to the node). */
  begin: () => void
}

/**
 * Prepares an attempt on `slot`, released with `parent` unless it ends
 * first, by plain calls: the slot is owned by `parent` from here. `begin`
 * starts the node: by callback when it has `begin` (no fiber, no scope: its
 * release is a plain cleanup; the attempt is returned as it is), else the
 * open and the first pull on a detached fiber of the strategy's runtime,
 * its stream in a child scope (returned as the Effect that forks that
 * scope). Either way the first events (or the failure) reach `report`
 * exactly once.
 */
export const launchNow = (
  pool: NodePool,
  parent: Scope.Scope,
  sources: Pick<Sources, "runtime">,
  slot: Slot,
  request: NodeRequest,
  startedAt: number,
  report: (attempt: Attempt, exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void,
  clock: NodeClock,
): Attempt | Effect.Effect<Attempt> => {
  const held = Finalizers.groupNow(parent)
  const attempt: Attempt = {
    slot,
    held,
    scope: undefined,
    startedAt,
    pull: undefined,
    next: undefined,
    cancel: () => undefined,
    reported: false,
    begin: () => undefined,
  }
  const deliver = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => {
    if (attempt.reported) return
    attempt.reported = true
    report(attempt, exit)
  }
  const node = slot.entry.node
  let stopNode: (() => void) | undefined
  // Runs last: the node stopped (unless it finished), the slot freed.
  held.add(() => {
    stopNode?.()
    pool.release(slot)
  })
  if (node.begin !== undefined) {
    // The node reports by callback: no fiber for the attempt at all.
    const begin = node.begin
    attempt.begin = () => {
      const started = begin(request, deliver, clock)
      attempt.pull = started.pull
      attempt.next = started.next
      attempt.cancel = started.stop
      stopNode = started.stop
    }
    return attempt
  }
  // Added to `parent` after `held`, so the stream is closed before the slot is freed.
  return Effect.map(Scope.fork(parent, ExecutionStrategy.sequential), (scope) => {
    attempt.scope = scope
    const first = Effect.flatMap(openOn(node, request, scope), (pull) => {
      attempt.pull = pull
      return firstNonEmpty(pull)
    })
    attempt.begin = () => {
      const fiber = Runtime.runFork(sources.runtime)(first)
      attempt.cancel = () => {
        if (!attempt.reported) fiber.unsafeInterruptAsFork(FiberId.none)
      }
      fiber.addObserver(deliver)
    }
    return attempt
  })
}

/** Ends an attempt that lost or failed: its first pull stopped, its node stream and slot freed. */
export const close = (attempt: Attempt): Effect.Effect<void> =>
  Effect.suspend(() => {
    attempt.cancel()
    if (attempt.scope === undefined) {
      attempt.held.close()
      return Effect.void
    }
    return Effect.zipRight(Scope.close(attempt.scope, Exit.void), Effect.sync(attempt.held.close))
  })

/**
 * The winning stream: its first chunk, then the rest pulled as it comes.
 * Failures count against the node; when the attempt's scope closes without
 * one (the end, or the reader stopping early at the token cap) the speed
 * seen so far is recorded. One pull per chunk, no stream stages per event;
 * `next` is the same sequence by callback, for a node that enforces its idle
 * limit itself and was started by callback (HTTP and simulated nodes).
 */
export const winner = (
  attempt: Attempt,
  firstAt: number,
  first: Chunk.Chunk<NodeEvent>,
  idleTimeoutMillis: number,
  now: () => number,
): { readonly pull: NodePull; readonly next: NodeNext | undefined } => {
  const { slot } = attempt
  let chars = 0
  let failed = false
  const see = (chunk: Chunk.Chunk<NodeEvent>) => {
    // Its array, indexed: a Chunk's iterator allocates a result per element.
    const events = Chunk.toReadonlyArray(chunk)
    for (let i = 0; i < events.length; i++) {
      const event = events[i]!
      if (event._tag === "Delta") chars += event.text.length
    }
  }
  see(first)
  /** The node's part in its health: the characters it sent, or its failure (noted once, by whichever read saw it). */
  const observe = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => {
    if (Exit.isSuccess(exit)) {
      see(exit.value)
      return
    }
    const error = Cause.failureOption(exit.cause)
    if (Option.isSome(error) && Option.isSome(error.value)) {
      failed = true
      slot.entry.health.failure(now(), error.value.value.reason, slot.trial)
    }
  }
  const limited = idleLimit(slot.entry, idleTimeoutMillis)(attempt.pull ?? ended)
  const next: NodePull = Effect.flatMap(Effect.exit(limited), (exit) => {
    observe(exit)
    return exit
  })
  let pending: Chunk.Chunk<NodeEvent> | undefined = first
  const pull: NodePull = Effect.suspend(() => {
    if (pending === undefined) return next
    const chunk = pending
    pending = undefined
    return Effect.succeed(chunk)
  })
  const sourceNext = attempt.next
  // The read in progress's callback, behind one observer made per attempt (not one per read).
  let reading: ((exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void) | undefined
  const observed = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => {
    const done = reading
    reading = undefined
    observe(exit)
    done?.(exit)
  }
  const byCallback: NodeNext | undefined =
    sourceNext === undefined || slot.entry.node.enforcesIdleTimeout !== true
      ? undefined
      : (done) => {
          if (pending !== undefined) {
            const chunk = pending
            pending = undefined
            done(Exit.succeed(chunk))
            return () => undefined
          }
          reading = done
          return sourceNext(observed)
        }
  attempt.held.add(() => {
    // Speed only: characters / 4 estimates tokens without a third tokenizer pass over the answer.
    if (!failed) slot.entry.health.succeeded(Math.ceil(chars / 4), now() - firstAt)
  })
  return { pull, next: byCallback }
}

// --- a whole answer (consensus authors and judges) --------------------------------------------

export interface Answer {
  readonly nodeId: string
  readonly events: ReadonlyArray<NodeEvent>
  readonly text: string
}

const textOf = (events: ReadonlyArray<NodeEvent>) =>
  events.map((event) => (event._tag === "Delta" ? event.text : "")).join("")

/** A pull's end of stream (`None` failure) as a `None` value; its failures as plain failures. */
const endOfStream = <A, E, R>(
  pull: Effect.Effect<A, Option.Option<E>, R>,
): Effect.Effect<Option.Option<A>, E, R> =>
  Effect.catchAll(Effect.map(pull, Option.some), (error) =>
    Option.isNone(error) ? Effect.succeed(Option.none()) : Effect.fail(error.value),
  )

/** Runs a request on a held slot to its end, with the first-token and idle limits; feeds the node's health. */
export const complete = (
  slot: Slot,
  request: NodeRequest,
  options: AttemptOptions,
  limitMillis?: number,
): Effect.Effect<Answer, NodeFailure> => {
  const { entry } = slot
  let firstAt: number | undefined
  let startedAt = 0
  const run = Effect.scoped(
    Effect.gen(function* () {
      startedAt = yield* Clock.currentTimeMillis
      const pull = yield* openOn(entry.node, request, yield* Effect.scope)
      const events: Array<NodeEvent> = []
      const first = yield* firstNonEmpty(pull).pipe(
        within(options.firstTokenTimeoutMillis, () =>
          Option.some(timedOut(entry, "no first token", options.firstTokenTimeoutMillis)),
        ),
        endOfStream,
      )
      if (Option.isNone(first)) return events
      firstAt = yield* Clock.currentTimeMillis
      entry.health.firstToken(firstAt - startedAt, slot.trial)
      // Held whole until judged, so bounded: a node ignoring max_tokens is cut just past the cap.
      let tokens = 0
      const add = (chunk: Chunk.Chunk<NodeEvent>): boolean => {
        for (const event of chunk) {
          events.push(event)
          if (event._tag !== "Delta") continue
          tokens += Tokens.count(event.text, request.maxTokens - tokens + 1)
          if (tokens > request.maxTokens) {
            events.push({ _tag: "Finish", reason: "length" })
            return false
          }
        }
        return true
      }
      if (!add(first.value)) return events
      while (true) {
        const next = yield* pull.pipe(idleLimit(entry, options.idleTimeoutMillis), endOfStream)
        if (Option.isNone(next) || !add(next.value)) return events
      }
    }),
  )
  return Effect.gen(function* () {
    const result = yield* Effect.either(
      within(limitMillis ?? 0, () => timedOut(entry, "no complete answer", limitMillis ?? 0))(run),
    )
    const now = yield* Clock.currentTimeMillis
    if (Either.isLeft(result)) {
      entry.health.failure(now, result.left.reason, slot.trial)
      return yield* Effect.fail(result.left)
    }
    if (firstAt === undefined) entry.health.firstToken(now - startedAt, slot.trial)
    const text = textOf(result.right)
    entry.health.succeeded(Tokens.count(text), now - (firstAt ?? startedAt))
    return { nodeId: entry.node.id, events: result.right, text }
  })
}
