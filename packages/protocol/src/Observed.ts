/**
 * An Effect whose outcome code on no fiber can read too: a shared store's
 * reply, waited for by a fiber when the Effect runs, or read by callback by
 * a plain call (`observe`) — a plain request's close, which then needs no
 * fiber to wait for its release and settlement. What `observe` gives is the
 * outcome as an `Exit`, or, where the work goes on in Effect (a retry, a
 * warning to log), the Effect that must still run: the same steps the fiber
 * would take from there, never a second implementation.
 *
 * The combinators below keep an Effect observable (an Effect's own `map` or
 * `flatMap` would make one that only a fiber can run), and are theirs for an
 * Exit or any other Effect.
 */
import { Cause, Effect, Exit, Option } from "effect"

/** Gives the outcome, once: an `Exit`, or an Effect still to run (perhaps observable in turn). */
export type Observer<A, E> = (then: (result: Effect.Effect<A, E>) => void) => void

const OBSERVE: unique symbol = Symbol("@swarmgate/protocol/Observed")

type Marked<A, E> = Effect.Effect<A, E> & { [OBSERVE]?: Observer<A, E> }

/** An Effect that waits for what `observer` gives, and that `observe` reads by plain calls. */
export const make = <A, E>(observer: Observer<A, E>): Effect.Effect<A, E> => {
  const effect: Marked<A, E> = Effect.async<A, E>((resume) => observer(resume))
  effect[OBSERVE] = observer
  return effect
}

/** An outcome reported once, by callback (a Redis `Reply`), as an observable Effect. */
export const of = <A, E>(source: {
  readonly observe: (then: (outcome: Exit.Exit<A, E>) => void) => void
}): Effect.Effect<A, E> => make((then) => source.observe(then))

/** Whether `observe` reads `effect` by plain calls (an `Exit`, or an Effect made here). */
export const isObservable = (effect: Effect.Effect<unknown, unknown>): boolean =>
  Exit.isExit(effect) || (effect as Marked<unknown, unknown>)[OBSERVE] !== undefined

/**
 * Reads `effect` by plain calls: `then` gets its `Exit` once it is in (at
 * once for an `Exit`), or the Effect still to run on a fiber (at once for an
 * Effect that is not observable; where an observable one hands the rest to
 * Effect).
 */
export const observe = <A, E>(
  effect: Effect.Effect<A, E>,
  then: (result: Effect.Effect<A, E>) => void,
): void => {
  const observer = Exit.isExit(effect) ? undefined : (effect as Marked<A, E>)[OBSERVE]
  if (observer === undefined) then(effect)
  else observer((result) => (result === effect ? then(result) : observe(result, then)))
}

/** `k` of `effect`'s exit, observable where `effect` is; a throw of `k` is a defect. */
export const onExit = <A, E, B, E2>(
  effect: Effect.Effect<A, E>,
  k: (exit: Exit.Exit<A, E>) => Effect.Effect<B, E2>,
): Effect.Effect<B, E2> => {
  const applied = (exit: Exit.Exit<A, E>): Effect.Effect<B, E2> => {
    try {
      return k(exit)
    } catch (thrown) {
      return Exit.die(thrown)
    }
  }
  if (Exit.isExit(effect)) return applied(effect as Exit.Exit<A, E>)
  if ((effect as Marked<A, E>)[OBSERVE] === undefined) return Effect.flatMap(Effect.exit(effect), applied)
  return make((then) =>
    observe(effect, (result) =>
      then(
        Exit.isExit(result)
          ? applied(result as Exit.Exit<A, E>)
          : Effect.flatMap(Effect.exit(result), applied),
      ),
    ),
  )
}

/** `Effect.map`, observable where `effect` is (any other Effect: `Effect.map` itself). */
export const map = <A, E, B>(effect: Effect.Effect<A, E>, f: (a: A) => B): Effect.Effect<B, E> =>
  isObservable(effect)
    ? onExit(effect, (exit) =>
        Exit.isSuccess(exit) ? Exit.succeed(f(exit.value)) : Exit.failCause(exit.cause),
      )
    : Effect.map(effect, f)

/** `Effect.asVoid`, observable where `effect` is. */
export const asVoid = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<void, E> =>
  isObservable(effect)
    ? onExit(effect, (exit) => (Exit.isSuccess(exit) ? Exit.void : Exit.failCause(exit.cause)))
    : Effect.asVoid(effect)

/** `Effect.catchAll` (failures, not defects), observable where `effect` is. */
export const catchAll = <A, E, B, E2>(
  effect: Effect.Effect<A, E>,
  handle: (error: E) => Effect.Effect<B, E2>,
): Effect.Effect<A | B, E2> => {
  if (!isObservable(effect)) return Effect.catchAll(effect, handle)
  return onExit(effect, (exit): Effect.Effect<A | B, E2> => {
    if (Exit.isSuccess(exit)) return exit as Exit.Exit<A, never> // a success has no error
    const failure = Cause.failureOption(exit.cause)
    return Option.isSome(failure) ? handle(failure.value) : Exit.failCause(Cause.stripFailures(exit.cause))
  })
}

/**
 * `Effect.uninterruptible`, observable where `effect` is: what a fiber runs
 * cannot be interrupted; a plain read has nothing to interrupt.
 */
export const uninterruptible = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> => {
  if (Exit.isExit(effect)) return effect
  const observer = (effect as Marked<A, E>)[OBSERVE]
  const wrapped: Marked<A, E> = Effect.uninterruptible(effect)
  if (observer !== undefined) wrapped[OBSERVE] = observer
  return wrapped
}
