/**
 * Plain cleanups for a scope, run together by one of its finalizers: a
 * synchronous release (a permit, a hold, a slot, an alarm) then costs no
 * Effect step and no scope bookkeeping of its own — on the request path,
 * where every step is paid per request.
 *
 * The scope's order holds: cleanups added one after another share one
 * finalizer and run newest first; a finalizer added to the scope itself in
 * between starts a new group after it, so everything still runs in the
 * reverse order of its adding. Each runs even if an earlier one threw (the
 * first error is rethrown after, as a defect). One added after the scope
 * closed runs at once.
 *
 * A request's own scope is made and closed the same way (`makeScopeNow`,
 * `closeNow`: no Effect step while it holds only plain cleanups), and its
 * waits hand their cleanup to it (`asyncIn`) instead of a canceler.
 */
import { Observed } from "@swarmgate/protocol"
import { Cause, Effect, ExecutionStrategy, Exit, Scope } from "effect"

export type Cleanup = (exit: Exit.Exit<unknown, unknown>) => void

type Finalizer = (exit: Exit.Exit<unknown, unknown>) => Effect.Effect<void>

interface Segment {
  readonly list: Array<Cleanup>
  readonly finalizer: Finalizer
  /** Set once the segment ran. */
  exit: Exit.Exit<unknown, unknown> | undefined
}

/** On a segment's finalizer: its segment, so that `close` can run it by a plain call. */
const SEGMENT_OF: unique symbol = Symbol("@swarmgate/dispatch/Finalizers/segmentOf")

/** On a finalizer added by `addObservedNow`: its Effect is made at the close and read by plain calls. */
const OBSERVED: unique symbol = Symbol("@swarmgate/dispatch/Finalizers/observed")

type SegmentFinalizer = Finalizer & { [SEGMENT_OF]?: Segment; [OBSERVED]?: true }

/**
 * A scope's current segment, kept on the scope itself: a WeakMap keyed by
 * every request's scope costs the garbage collector (ephemerons) more than
 * one property.
 */
const SEGMENT: unique symbol = Symbol("@swarmgate/dispatch/Finalizers/segment")

type WithSegment = { [SEGMENT]?: Segment }

const segmentOf = (scope: Scope.Scope): Segment | undefined => (scope as WithSegment)[SEGMENT]

/**
 * The state of a scope of Effect's own kind: while open, its finalizers
 * newest last in an insertion-ordered map (read to see whether anything was
 * added after a segment, and added to as Effect adds its own); once closed,
 * its exit. Undefined for a scope of another kind: every cleanup then gets a
 * finalizer of its own through `Scope.addFinalizerExit`.
 */
type ScopeState =
  | { readonly _tag: "Open"; readonly finalizers: Map<unknown, unknown> }
  | { readonly _tag: "Closed"; readonly exit: Exit.Exit<unknown, unknown> }

const stateOf = (scope: Scope.Scope): ScopeState | undefined => {
  const state = (scope as unknown as { state?: { _tag?: unknown; finalizers?: unknown; exit?: unknown } })
    .state
  if (state?._tag === "Open" && state.finalizers instanceof Map) return state as ScopeState
  if (state?._tag === "Closed" && state.exit !== undefined) return state as ScopeState
  return undefined
}

const isLast = (map: Map<unknown, unknown>, finalizer: Finalizer) => {
  let last: unknown
  for (const value of map.values()) last = value
  return last === finalizer
}

const runAll = <A>(list: Array<(a: A) => void>, a: A) => {
  let error: unknown
  let threw = false
  for (let i = list.length - 1; i >= 0; i--) {
    try {
      list[i]!(a)
    } catch (e) {
      if (!threw) error = e
      threw = true
    }
  }
  list.length = 0
  if (threw) throw error
}

const runSegment = (segment: Segment, exit: Exit.Exit<unknown, unknown>) => {
  segment.exit = exit
  runAll(segment.list, exit)
}

/**
 * Adds `cleanup` to the plain cleanups of `scope`, as a plain call: for code
 * already running on the scope's fiber (inside `withFiberRuntime`, a
 * generator body), so that adding costs no Effect step either. A new
 * segment's finalizer goes into the open scope's map the way Effect's own
 * scopes add theirs; a scope of another kind gets it through
 * `Scope.addFinalizerExit`, run at once.
 */
export const addNow = (scope: Scope.Scope, cleanup: Cleanup): void => {
  const current = segmentOf(scope)
  if (current !== undefined && current.exit !== undefined) {
    cleanup(current.exit)
    return
  }
  const state = stateOf(scope)
  if (current !== undefined && state?._tag === "Open" && isLast(state.finalizers, current.finalizer)) {
    current.list.push(cleanup)
    return
  }
  const list = [cleanup]
  const finalizer: SegmentFinalizer = (exit) => Effect.sync(() => runSegment(segment, exit))
  const segment: Segment = { list, exit: undefined, finalizer }
  finalizer[SEGMENT_OF] = segment
  ;(scope as WithSegment)[SEGMENT] = segment
  if (state === undefined) {
    Effect.runSync(Scope.addFinalizerExit(scope, segment.finalizer))
  } else if (state._tag === "Open") {
    state.finalizers.set({}, segment.finalizer)
  } else {
    // Closed already: runs at once, its error (if any) thrown as it is.
    runSegment(segment, state.exit)
  }
}

/**
 * A finalizer (an Effect) added to `scope` by a plain call, as `addNow` adds
 * a cleanup: for code running on the scope's fiber that must not wait for a
 * step before its finalizer is in place (what it just sent must be undone
 * whatever happens next). On a scope of another kind through
 * `Scope.addFinalizerExit`; on a closed scope, run at once on a fiber of its
 * own (the default runtime's).
 */
export const addFinalizerNow = (scope: Scope.Scope, finalizer: Finalizer): void => {
  const state = stateOf(scope)
  // Another kind of scope: added as it adds (a closed one runs the finalizer, perhaps not at once).
  if (state === undefined) Effect.runFork(Scope.addFinalizerExit(scope, finalizer))
  else if (state._tag === "Open") state.finalizers.set({}, finalizer)
  else Effect.runFork(finalizer(state.exit))
}

/**
 * `addFinalizerNow` for a finalizer whose Effect is observable (`Observed`:
 * what it sends is read back by callback, as a shared store's reply): at a
 * `closeNow` its Effect is made when the close reaches it and read by plain
 * calls, the older cleanups run once it is in — so a close with no other
 * finalizer of Effect's kind waits on no fiber. Its Effect runs as any
 * finalizer's wherever a fiber closes the scope.
 */
export const addObservedNow = (scope: Scope.Scope, finalizer: Finalizer): void => {
  const marked: SegmentFinalizer = finalizer
  marked[OBSERVED] = true
  addFinalizerNow(scope, marked)
}

/** Whether `scope` is still open: false from the moment it starts closing (a scope of another kind: true). */
export const isOpen = (scope: Scope.Scope): boolean => {
  const state = stateOf(scope)
  return state === undefined || state._tag === "Open"
}

/**
 * Effect's own kind of scope, made by a plain call: what `Scope.make()`
 * returns, without running an Effect for it (a request's scope, made where
 * the request arrives). Falls back to `Scope.make()` if this Effect's scopes
 * ever look different from what `stateOf` reads.
 */
const scopePrototype: object | undefined = (() => {
  const sample = Effect.runSync(Scope.make())
  const state = stateOf(sample)
  return state?._tag === "Open" && state.finalizers.size === 0 && "strategy" in sample
    ? (Object.getPrototypeOf(sample) as object)
    : undefined
})()

export const makeScopeNow = (): Scope.CloseableScope => {
  if (scopePrototype === undefined) return Effect.runSync(Scope.make())
  const scope = Object.create(scopePrototype) as {
    strategy: ExecutionStrategy.ExecutionStrategy
    state: ScopeState
  }
  scope.strategy = ExecutionStrategy.sequential
  scope.state = { _tag: "Open", finalizers: new Map() }
  return scope as unknown as Scope.CloseableScope
}

/**
 * Closes `scope` with `exit`. When it holds only plain cleanups (the common
 * request), they run here, at the call, newest first, and the result is an
 * Effect with nothing left to do (or, if a cleanup threw, the first error as
 * a defect, after every cleanup ran). With observed finalizers too
 * (`addObservedNow`), the close runs here as far as it can and the result is
 * observable (`Observed.observe`): the rest runs by plain calls as each
 * finalizer's outcome comes in. Otherwise nothing runs until the returned
 * Effect does: it is `Scope.close` — the same order and outcome, with the
 * plain cleanups run by plain calls and a step only per finalizer of
 * Effect's kind (Effect's own close walks every finalizer through a
 * collection of exits).
 */
export const closeNow = (
  scope: Scope.CloseableScope,
  exit: Exit.Exit<unknown, unknown>,
): Effect.Effect<void> => {
  const state = stateOf(scope)
  if (state?._tag !== "Open") return Scope.close(scope, exit)
  const finalizers = Array.from(state.finalizers.values()) as Array<SegmentFinalizer>
  if (finalizers.every((finalizer) => finalizer[SEGMENT_OF] !== undefined || finalizer[OBSERVED] === true)) {
    ;(scope as unknown as { state: ScopeState }).state = { _tag: "Closed", exit }
    return closeFrom(finalizers, finalizers.length - 1, exit, undefined)
  }
  if (!ExecutionStrategy.isSequential((scope as unknown as ScopeWithStrategy).strategy))
    return Scope.close(scope, exit)
  // Read when it runs, as `Scope.close` does: a finalizer added before then runs too, and a second
  // run finds the scope closed.
  return Effect.suspend(() => {
    const current = stateOf(scope)
    if (current?._tag !== "Open") return Effect.void
    const all = Array.from(current.finalizers.values()) as Array<SegmentFinalizer>
    ;(scope as unknown as { state: ScopeState }).state = { _tag: "Closed", exit }
    return closeFrom(all, all.length - 1, exit, undefined)
  })
}

interface ScopeWithStrategy {
  readonly strategy: ExecutionStrategy.ExecutionStrategy
}

/**
 * Runs `finalizers[i]` down to the first: plain cleanups by plain calls, an
 * observed finalizer's Effect made now and the rest run once its outcome is
 * in (`Observed.onExit`), any other finalizer of Effect's kind as a step
 * before the rest. Every one runs; failures are kept in order (a throwing
 * cleanup as a defect).
 */
const closeFrom = (
  finalizers: ReadonlyArray<SegmentFinalizer>,
  from: number,
  exit: Exit.Exit<unknown, unknown>,
  failed: Cause.Cause<unknown> | undefined,
): Effect.Effect<void> => {
  let failure = failed
  for (let i = from; i >= 0; i--) {
    const finalizer = finalizers[i]!
    const segment = finalizer[SEGMENT_OF]
    if (segment === undefined) {
      const rest = (result: Exit.Exit<unknown, unknown>) =>
        closeFrom(
          finalizers,
          i - 1,
          exit,
          Exit.isSuccess(result)
            ? failure
            : failure === undefined
              ? result.cause
              : Cause.sequential(failure, result.cause),
        )
      if (finalizer[OBSERVED] !== true)
        return Effect.flatMap(Effect.exit(Effect.suspend(() => finalizer(exit))), rest)
      let made: Effect.Effect<void>
      try {
        made = finalizer(exit)
      } catch (thrown) {
        made = Exit.die(thrown)
      }
      return Observed.onExit(made, rest)
    }
    try {
      runSegment(segment, exit)
    } catch (e) {
      // A segment's first error only, as the cleanups' own rule has it.
      const died = Cause.die(e)
      failure = failure === undefined ? died : Cause.sequential(failure, died)
    }
  }
  // Finalizers cannot fail: what is here is defects and interruptions, as in `Scope.close`.
  return failure === undefined ? Effect.void : Effect.failCause(failure as Cause.Cause<never>)
}

/**
 * `Effect.async` for a wait whose cleanup is a plain cleanup of `scope`:
 * `register` returns it, and it must be safe to call again (the wait's own
 * ending has usually run it already). Effect wraps an `async` that returns a
 * canceler in an `onInterrupt` region, ~7 run-loop steps per wait; here an
 * interrupted wait resumes at once and its cleanup runs when `scope` closes.
 * For waits that last no longer than their scope (a request's own). Without
 * a scope it is `Effect.async` with the cleanup as its canceler.
 */
export const asyncIn = <A, E = never>(
  scope: Scope.Scope | undefined,
  register: (resume: (effect: Effect.Effect<A, E>) => void) => (() => void) | undefined,
): Effect.Effect<A, E> =>
  scope === undefined
    ? Effect.async<A, E>((resume) => {
        const cleanup = register(resume)
        return cleanup === undefined ? undefined : Effect.sync(cleanup)
      })
    : Effect.async<A, E>((resume) => {
        const cleanup = register(resume)
        if (cleanup !== undefined) addNow(scope, cleanup)
      })

/** `addNow` as an Effect. */
export const add = (scope: Scope.Scope, cleanup: Cleanup): Effect.Effect<void> =>
  Effect.sync(() => addNow(scope, cleanup))

/** Cleanups released together, early or with the scope they were made in (an attempt's slot and stream). */
export interface Group {
  /** Adds a cleanup; once the group was closed, runs it at once. */
  readonly add: (cleanup: () => void) => void
  /** Runs the group's cleanups now, newest first; later calls, and the scope's close, do nothing. */
  readonly close: () => void
}

/** A group released with `scope` unless closed first, made by a plain call (see `addNow`). */
export const groupNow = (scope: Scope.Scope): Group => {
  const list: Array<() => void> = []
  let closed = false
  const close = () => {
    if (closed) return
    closed = true
    runAll(list, undefined)
  }
  addNow(scope, close)
  return {
    add: (cleanup) => {
      if (closed) cleanup()
      else list.push(cleanup)
    },
    close,
  }
}
