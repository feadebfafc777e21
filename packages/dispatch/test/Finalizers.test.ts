import { describe, expect, it } from "@effect/vitest"
import { Observed } from "@swarmgate/protocol"
import { Cause, Chunk, Effect, ExecutionStrategy, Exit, Fiber, FiberId, Scope } from "effect"
import * as Finalizers from "../src/Finalizers"

/** A finalizer of the scope's own (not a plain cleanup) that records its name when it runs. */
const recordOn = (scope: Scope.Scope, ran: Array<string>, name: string) =>
  Scope.addFinalizer(
    scope,
    Effect.sync(() => ran.push(name)),
  )

describe("Finalizers", () => {
  it.effect("plain cleanups and the scope's own finalizers run in the reverse order of their adding", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const ran: Array<string> = []
      const own = (name: string) => recordOn(scope, ran, name)
      const plain = (name: string) => Finalizers.add(scope, () => ran.push(name))
      yield* own("own 1")
      yield* plain("plain 1")
      yield* plain("plain 2")
      yield* own("own 2")
      yield* plain("plain 3")
      const child = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      yield* recordOn(child, ran, "child")
      yield* plain("plain 4")
      yield* Scope.close(scope, Exit.void)
      expect(ran).toEqual(["plain 4", "child", "plain 3", "own 2", "plain 2", "plain 1", "own 1"])
    }),
  )

  it.effect("cleanups added together share one finalizer of the scope", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      for (let i = 0; i < 5; i++) yield* Finalizers.add(scope, () => undefined)
      const finalizers = (scope as unknown as { state: { finalizers: Map<unknown, unknown> } }).state
        .finalizers
      expect(finalizers.size).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.effect("each cleanup gets the scope's exit and runs even if an earlier one threw", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const seen: Array<string> = []
      yield* Finalizers.add(scope, (exit) => seen.push(Exit.isInterrupted(exit) ? "interrupted" : "other"))
      yield* Finalizers.add(scope, () => {
        throw new Error("boom")
      })
      yield* Finalizers.add(scope, () => seen.push("last added, first run"))
      const closed = yield* Effect.exit(Scope.close(scope, Exit.interrupt(FiberId.none)))
      expect(seen).toEqual(["last added, first run", "interrupted"])
      expect(Exit.isFailure(closed) && Cause.isDie(closed.cause)).toBe(true)
    }),
  )

  it.effect("a cleanup added after the scope closed runs at once", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      yield* Finalizers.add(scope, () => undefined)
      yield* Scope.close(scope, Exit.void)
      let ran = false
      yield* Finalizers.add(scope, () => {
        ran = true
      })
      expect(ran).toBe(true)
    }),
  )

  it.effect(
    "addNow adds by a plain call; on a scope closed before any cleanup it runs at once with the scope's exit",
    () =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const ran: Array<string> = []
        Finalizers.addNow(scope, () => ran.push("a"))
        yield* recordOn(scope, ran, "own")
        Finalizers.addNow(scope, () => ran.push("b"))
        Finalizers.addNow(scope, () => ran.push("c"))
        expect(ran).toEqual([])
        yield* Scope.close(scope, Exit.void)
        expect(ran).toEqual(["c", "b", "own", "a"])

        const closed = yield* Scope.make()
        yield* Scope.close(closed, Exit.interrupt(FiberId.none))
        let seen: Exit.Exit<unknown, unknown> | undefined
        Finalizers.addNow(closed, (exit) => {
          seen = exit
        })
        expect(seen !== undefined && Exit.isInterrupted(seen)).toBe(true)
        const boom = new Error("boom")
        expect(() =>
          Finalizers.addNow(closed, () => {
            throw boom
          }),
        ).toThrow(boom)
      }),
  )

  it.effect("a group closes once: early, or with its scope", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const ran: Array<string> = []
      const early = Finalizers.groupNow(scope)
      early.add(() => ran.push("early a"))
      early.add(() => ran.push("early b"))
      const late = Finalizers.groupNow(scope)
      late.add(() => ran.push("late"))
      early.close()
      early.close()
      early.add(() => ran.push("added after close"))
      yield* Scope.close(scope, Exit.void)
      expect(ran).toEqual(["early b", "early a", "added after close", "late"])
    }),
  )

  it.effect(
    "makeScopeNow makes a scope of Effect's own kind: finalizers, forks and forked fibers as Scope.make's",
    () =>
      Effect.gen(function* () {
        const scope = Finalizers.makeScopeNow()
        const ran: Array<string> = []
        yield* recordOn(scope, ran, "own")
        const child = yield* Scope.fork(scope, ExecutionStrategy.sequential)
        yield* recordOn(child, ran, "child")
        const forked = yield* Effect.forkIn(Effect.never, scope)
        Finalizers.addNow(scope, () => ran.push("plain"))
        yield* Scope.close(scope, Exit.void)
        expect(ran).toEqual(["plain", "child", "own"])
        const exit = yield* Fiber.await(forked)
        expect(Exit.isInterrupted(exit)).toBe(true)
        // Closed: a later finalizer runs at once.
        yield* recordOn(scope, ran, "after")
        expect(ran.at(-1)).toBe("after")
      }),
  )

  it.effect("closeNow runs plain cleanups by plain calls, newest first, and leaves nothing to run", () =>
    Effect.gen(function* () {
      const scope = Finalizers.makeScopeNow()
      const ran: Array<string> = []
      Finalizers.addNow(scope, () => ran.push("a"))
      const group = Finalizers.groupNow(scope)
      group.add(() => ran.push("group"))
      Finalizers.addNow(scope, () => ran.push("b"))
      const closing = Finalizers.closeNow(scope, Exit.void)
      // Already ran, before the returned Effect is run.
      expect(ran).toEqual(["b", "group", "a"])
      expect(closing).toBe(Effect.void)
      let late = false
      Finalizers.addNow(scope, () => {
        late = true
      })
      expect(late).toBe(true)
      yield* Scope.close(scope, Exit.void)
      expect(ran).toEqual(["b", "group", "a"])
    }),
  )

  it.effect(
    "closeNow with a finalizer of Effect's kind runs nothing until it is run, then all in the scope's order",
    () =>
      Effect.gen(function* () {
        const scope = Finalizers.makeScopeNow()
        const ran: Array<string> = []
        Finalizers.addNow(scope, () => ran.push("plain 1"))
        yield* recordOn(scope, ran, "own")
        Finalizers.addNow(scope, () => ran.push("plain 2"))
        const closing = Finalizers.closeNow(scope, Exit.void)
        expect(ran).toEqual([])
        yield* closing
        expect(ran).toEqual(["plain 2", "own", "plain 1"])
      }),
  )

  it.effect(
    "closeNow runs every finalizer even if one died, and ends with each defect, as Scope.close does",
    () =>
      Effect.gen(function* () {
        const ran: Array<string> = []
        const outcome = (close: (scope: Scope.CloseableScope) => Effect.Effect<void>) =>
          Effect.gen(function* () {
            const scope = Finalizers.makeScopeNow()
            Finalizers.addNow(scope, () => ran.push("plain 1"))
            yield* Scope.addFinalizer(scope, Effect.dieMessage("own 1"))
            Finalizers.addNow(scope, () => ran.push("plain 2"))
            Finalizers.addFinalizerNow(scope, () => Effect.sync(() => ran.push("own 2")))
            Finalizers.addNow(scope, () => {
              throw new Error("plain 3")
            })
            const exit = yield* Effect.exit(close(scope))
            return Exit.isFailure(exit)
              ? Cause.defects(exit.cause).pipe(Chunk.map((d) => (d as Error).message))
              : []
          })
        const ours = yield* outcome((scope) => Finalizers.closeNow(scope, Exit.void))
        const effects = yield* outcome((scope) => Scope.close(scope, Exit.void))
        expect(ran).toEqual(["own 2", "plain 2", "plain 1", "own 2", "plain 2", "plain 1"])
        expect([...ours]).toEqual(["plain 3", "own 1"])
        expect([...ours]).toEqual([...effects])
      }),
  )

  for (const [name, close] of [
    ["Scope.close", Scope.close],
    ["closeNow", Finalizers.closeNow],
  ] as const) {
    it.effect(`${name}: a finalizer added before its Effect runs runs too; a second run runs nothing`, () =>
      Effect.gen(function* () {
        const scope = Finalizers.makeScopeNow()
        let ran = 0
        yield* Scope.addFinalizer(
          scope,
          Effect.sync(() => ran++),
        )
        const closing = close(scope, Exit.void)
        yield* Scope.addFinalizer(
          scope,
          Effect.sync(() => ran++),
        )
        yield* closing
        yield* closing
        expect(ran).toBe(2)
      }),
    )
  }

  it.effect(
    "closeNow runs every cleanup even if one threw, then fails with the first error as a defect",
    () =>
      Effect.gen(function* () {
        const scope = Finalizers.makeScopeNow()
        const ran: Array<string> = []
        const boom = new Error("boom")
        Finalizers.addNow(scope, () => ran.push("first added"))
        Finalizers.addNow(scope, () => {
          throw boom
        })
        Finalizers.addNow(scope, () => ran.push("last added"))
        const closed = yield* Effect.exit(Finalizers.closeNow(scope, Exit.void))
        expect(ran).toEqual(["last added", "first added"])
        expect(Exit.isFailure(closed) && Cause.isDie(closed.cause)).toBe(true)
      }),
  )
  /** An outcome reported later by callback, as a store's reply is. */
  const later = () => {
    let report: ((outcome: Exit.Exit<void, never>) => void) | undefined
    let outcome: Exit.Exit<void, never> | undefined
    const effect = Observed.of<void, never>({
      observe: (then) => {
        if (outcome !== undefined) then(outcome)
        else report = then
      },
    })
    return {
      effect,
      settle: (exit: Exit.Exit<void, never>) => {
        outcome = exit
        report?.(exit)
      },
    }
  }

  /** A request's scope as the scaled-out close sees it: a plain cleanup, the observed finalizer, another. */
  const aroundObserved = (finalizer: (ran: Array<string>) => Effect.Effect<void>) => {
    const scope = Finalizers.makeScopeNow()
    const ran: Array<string> = []
    Finalizers.addNow(scope, () => ran.push("plain 1"))
    Finalizers.addObservedNow(scope, () => finalizer(ran))
    Finalizers.addNow(scope, () => ran.push("plain 2"))
    return { scope, ran }
  }

  it.effect(
    "closeNow with an observed finalizer: newer cleanups at once, older ones by callback once its outcome is in",
    () =>
      Effect.gen(function* () {
        const reply = later()
        const { scope, ran } = aroundObserved((ran) => {
          ran.push("observed made")
          return reply.effect
        })
        const closing = Finalizers.closeNow(scope, Exit.void)
        expect(ran).toEqual(["plain 2", "observed made"])
        expect(Observed.isObservable(closing)).toBe(true)
        const read: Array<Effect.Effect<void>> = []
        Observed.observe(closing, (result) => read.push(result))
        expect(read).toEqual([])
        reply.settle(Exit.void)
        // By plain calls: the rest ran in the reply's callback, and the close ended with nothing to run.
        expect(ran).toEqual(["plain 2", "observed made", "plain 1"])
        expect(read.length).toBe(1)
        expect(Exit.isExit(read[0]) && Exit.isSuccess(read[0] as Exit.Exit<void>)).toBe(true)
      }),
  )

  it.effect("an observed finalizer's defect and a cleanup's throw end the close as Scope.close ends it", () =>
    Effect.gen(function* () {
      const outcome = (close: (scope: Scope.CloseableScope) => Effect.Effect<void>) =>
        Effect.gen(function* () {
          const ran: Array<string> = []
          const scope = Finalizers.makeScopeNow()
          Finalizers.addNow(scope, () => {
            throw new Error("plain 1")
          })
          Finalizers.addObservedNow(scope, () =>
            Observed.map(Exit.die(new Error("observed")), () => undefined),
          )
          Finalizers.addNow(scope, () => ran.push("plain 2"))
          const exit = yield* Effect.exit(close(scope))
          const defects = Exit.isFailure(exit)
            ? [...Cause.defects(exit.cause).pipe(Chunk.map((d) => (d as Error).message))]
            : []
          return { ran, defects }
        })
      const ours = yield* outcome((scope) => Finalizers.closeNow(scope, Exit.void))
      const effects = yield* outcome((scope) => Scope.close(scope, Exit.void))
      expect(ours).toEqual({ ran: ["plain 2"], defects: ["observed", "plain 1"] })
      expect(ours).toEqual(effects)
    }),
  )

  it.effect("an observed finalizer that throws as it is made is a defect, and the close goes on", () =>
    Effect.gen(function* () {
      const { scope, ran } = aroundObserved(() => {
        throw new Error("making")
      })
      const exit = yield* Effect.exit(Finalizers.closeNow(scope, Exit.void))
      expect(ran).toEqual(["plain 2", "plain 1"])
      expect(Exit.isFailure(exit) && [...Cause.defects(exit.cause)].map((d) => (d as Error).message)).toEqual(
        ["making"],
      )
    }),
  )

  it.effect(
    "an observed finalizer that hands on an Effect: the close hands it on, and the older cleanups run after it, once",
    () =>
      Effect.gen(function* () {
        const reply = later()
        const { scope, ran } = aroundObserved((ran) =>
          Observed.onExit(reply.effect, () => Effect.sync(() => ran.push("handed on"))),
        )
        const read: Array<Effect.Effect<void>> = []
        Observed.observe(Finalizers.closeNow(scope, Exit.void), (result) => read.push(result))
        reply.settle(Exit.void)
        expect(ran).toEqual(["plain 2"])
        expect(read.length).toBe(1)
        expect(Exit.isExit(read[0]!)).toBe(false)
        yield* read[0]!
        expect(ran).toEqual(["plain 2", "handed on", "plain 1"])
      }),
  )

  it.effect("an observed finalizer runs as any other where a fiber closes the scope", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const ran: Array<string> = []
      const reply = later()
      Finalizers.addNow(scope, () => ran.push("plain"))
      Finalizers.addObservedNow(scope, () => Observed.map(reply.effect, () => ran.push("observed")))
      const closing = yield* Effect.fork(Scope.close(scope, Exit.void))
      yield* Effect.yieldNow()
      expect(ran).toEqual([])
      reply.settle(Exit.void)
      yield* Fiber.join(closing)
      expect(ran).toEqual(["observed", "plain"])
    }),
  )
})
