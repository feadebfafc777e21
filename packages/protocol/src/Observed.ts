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
 * Exit or any other Effect. For an `Exit` they apply their function at the
 * call: an Exit is its outcome already.
 */
import { Cause, Effect, Effectable, Exit, Option } from "effect"

/** Gives the outcome, once: an `Exit`, or an Effect still to run (perhaps observable in turn). */
export type Observer<A, E> = (then: (result: Effect.Effect<A, E>) => void) => void

/**
 * One object per observable Effect, of one shape: a fiber that runs it makes
 * the wait (`commit`) only then; a plain read calls `observer`.
 */
class ObservedEffect<A, E> extends Effectable.Class<A, E> {
  constructor(
    readonly observer: Observer<A, E>,
    /** What a fiber runs of it, and whatever it hands on, cannot be interrupted. */
    readonly uninterruptible: boolean,
  ) {
    super()
  }

  commit(): Effect.Effect<A, E> {
    const waited = Effect.async<A, E>((resume) => {
      this.observer(resume)
    })
    return this.uninterruptible ? Effect.uninterruptible(waited) : waited
  }
}

/** An Effect that waits for what `observer` gives, and that `observe` reads by plain calls. */
export const make = <A, E>(observer: Observer<A, E>): Effect.Effect<A, E> =>
  new ObservedEffect(observer, false)

/** An outcome reported once, by callback (a Redis `Reply`), as an observable Effect. */
export const of = <A, E>(source: {
  readonly observe: (then: (outcome: Exit.Exit<A, E>) => void) => void
}): Effect.Effect<A, E> => make((then) => source.observe(then))

/** Whether `observe` reads `effect` by plain calls (an `Exit`, or an Effect made here). */
export const isObservable = (effect: Effect.Effect<unknown, unknown>): boolean =>
  Exit.isExit(effect) || effect instanceof ObservedEffect

/**
 * Reads `effect` by plain calls: `then` gets its `Exit` once it is in (at
 * once for an `Exit`), or the Effect still to run on a fiber (at once for an
 * Effect that is not observable; where an observable one hands the rest to
 * Effect — uninterruptible if it was).
 */
export const observe = <A, E>(
  effect: Effect.Effect<A, E>,
  then: (result: Effect.Effect<A, E>) => void,
): void => observeIn(effect, then, false)

const observeIn = <A, E>(
  effect: Effect.Effect<A, E>,
  then: (result: Effect.Effect<A, E>) => void,
  uninterruptible: boolean,
): void => {
  if (!(effect instanceof ObservedEffect)) {
    then(uninterruptible && !Exit.isExit(effect) ? Effect.uninterruptible(effect) : effect)
    return
  }
  const observed = effect as ObservedEffect<A, E>
  const protect = uninterruptible || observed.uninterruptible
  observed.observer((result) => {
    // An observer handing back its own Effect would wait for itself for ever: a bug, made a defect.
    if (result === effect) then(Exit.die(new Error("an observed Effect's observer gave back that Effect")))
    else observeIn(result, then, protect)
  })
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
  if (!(effect instanceof ObservedEffect)) return Effect.flatMap(Effect.exit(effect), applied)
  return new ObservedEffect<B, E2>(
    (then) =>
      observe(effect, (result) =>
        then(
          Exit.isExit(result)
            ? applied(result as Exit.Exit<A, E>)
            : Effect.flatMap(Effect.exit(result), applied),
        ),
      ),
    (effect as ObservedEffect<A, E>).uninterruptible,
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

/**
 * `Effect.matchEffect`, observable where `effect` is: a success goes to
 * `onSuccess`, a failure alone to `onFailure`, a defect or an interruption
 * goes on as it is; a failure with a defect (rare) is handed to
 * `Effect.matchEffect` itself, whose rule for it (its failures become
 * defects) a fiber applies.
 */
export const matchEffect = <A, E, B, E2, C, E3>(
  effect: Effect.Effect<A, E>,
  options: {
    readonly onFailure: (error: E) => Effect.Effect<B, E2>
    readonly onSuccess: (value: A) => Effect.Effect<C, E3>
  },
): Effect.Effect<B | C, E2 | E3> => {
  if (!isObservable(effect)) return Effect.matchEffect(effect, options)
  return onExit(effect, (exit): Effect.Effect<B | C, E2 | E3> => {
    if (Exit.isSuccess(exit)) return options.onSuccess(exit.value)
    const failure = Cause.failureOption(exit.cause)
    if (Option.isNone(failure)) return exit as unknown as Exit.Exit<never, never>
    if (Cause.isDie(exit.cause)) return Effect.matchEffect(exit, options)
    return options.onFailure(failure.value)
  })
}

/**
 * `Effect.catchAll`, observable where `effect` is: a failure is handled, a
 * defect or an interruption goes on as it is; a cause with both (rare) is
 * handed to `Effect.catchAll` itself, whose rule for it a fiber applies.
 */
export const catchAll = <A, E, B, E2>(
  effect: Effect.Effect<A, E>,
  handle: (error: E) => Effect.Effect<B, E2>,
): Effect.Effect<A | B, E2> => {
  if (!isObservable(effect)) return Effect.catchAll(effect, handle)
  return onExit(effect, (exit): Effect.Effect<A | B, E2> => {
    // A success has no error, and a cause without failures none either: both go on as they are.
    if (Exit.isSuccess(exit)) return exit as Exit.Exit<A, never>
    const failure = Cause.failureOption(exit.cause)
    if (Option.isNone(failure)) return exit as unknown as Exit.Exit<never, never>
    if (Cause.isDie(exit.cause)) return Effect.catchAll(exit, handle)
    return handle(failure.value)
  })
}

/**
 * `Effect.uninterruptible`, observable where `effect` is: what a fiber runs
 * of it (the wait, and whatever its outcome hands on) cannot be interrupted;
 * a plain read has nothing to interrupt, and what it hands on is wrapped.
 */
export const uninterruptible = <A, E>(effect: Effect.Effect<A, E>): Effect.Effect<A, E> => {
  if (Exit.isExit(effect)) return effect
  if (effect instanceof ObservedEffect)
    return new ObservedEffect((effect as ObservedEffect<A, E>).observer, true)
  return Effect.uninterruptible(effect)
}
