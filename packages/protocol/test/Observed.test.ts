import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Fiber, FiberId } from "effect"
import * as fc from "fast-check"
import * as Observed from "../src/Observed"

/** A source whose outcome is reported by callback, now or when `settle` is called. */
const reply = <A, E>() => {
  let outcome: Exit.Exit<A, E> | undefined
  const waiting: Array<(outcome: Exit.Exit<A, E>) => void> = []
  return {
    effect: Observed.of<A, E>({
      observe: (then) => {
        if (outcome !== undefined) then(outcome)
        else waiting.push(then)
      },
    }),
    settle: (exit: Exit.Exit<A, E>) => {
      outcome = exit
      for (const then of waiting.splice(0)) then(exit)
    },
  }
}

type Source = "exit" | "reply now" | "reply later" | "plain effect"
type Step =
  | "map"
  | "asVoid"
  | "catchAll to exit"
  | "catchAll to effect"
  | "onExit to exit"
  | "matchEffect to exit"
  | "matchEffect to effect"
  | "uninterruptible"
type Outcome = "success" | "failure" | "defect" | "failure and defect"

const exitOf = (outcome: Outcome): Exit.Exit<number, string> =>
  outcome === "success"
    ? Exit.succeed(1)
    : outcome === "failure"
      ? Exit.fail("no")
      : outcome === "defect"
        ? Exit.die(new Error("bug"))
        : Exit.failCause(Cause.sequential(Cause.fail("no"), Cause.die(new Error("bug"))))

const build = (source: Source, outcome: Outcome) => {
  const exit = exitOf(outcome)
  if (source === "exit") return { effect: exit as Effect.Effect<unknown, string>, settle: () => {} }
  if (source === "plain effect")
    return { effect: Effect.suspend(() => exit) as Effect.Effect<unknown, string>, settle: () => {} }
  const r = reply<unknown, string>()
  if (source === "reply now") r.settle(exit)
  return { effect: r.effect, settle: () => r.settle(exit) }
}

const apply = (effect: Effect.Effect<unknown, string>, step: Step): Effect.Effect<unknown, string> => {
  switch (step) {
    case "map":
      return Observed.map(effect, (a) => [a])
    case "asVoid":
      return Observed.asVoid(effect)
    case "catchAll to exit":
      return Observed.catchAll(effect, (e) => Exit.succeed(`caught ${e}`))
    case "catchAll to effect":
      return Observed.catchAll(effect, (e) => Effect.sync(() => `caught later ${e}`))
    case "onExit to exit":
      return Observed.onExit(effect, (exit) =>
        Exit.isSuccess(exit) ? Exit.succeed("ok") : Exit.fail("again"),
      )
    case "matchEffect to exit":
      return Observed.matchEffect(effect, {
        onSuccess: (a) => Exit.succeed([a]),
        onFailure: (e) => Exit.succeed(`handled ${e}`),
      })
    case "matchEffect to effect":
      return Observed.matchEffect(effect, {
        onSuccess: (a) => Exit.succeed([a]),
        onFailure: (e) => Effect.sync(() => `handled later ${e}`),
      })
    case "uninterruptible":
      return Observed.uninterruptible(effect)
  }
}

const summary = (exit: Exit.Exit<unknown, string>) =>
  Exit.isSuccess(exit)
    ? { success: exit.value }
    : { failures: [...Cause.failures(exit.cause)], defects: Cause.defects(exit.cause).length }

describe("Observed", () => {
  it("an Effect read by plain calls gives what the same Effect run by a fiber gives", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom<Source>("exit", "reply now", "reply later", "plain effect"),
        fc.constantFrom<Outcome>("success", "failure", "defect", "failure and defect"),
        fc.array(
          fc.constantFrom<Step>(
            "map",
            "asVoid",
            "catchAll to exit",
            "catchAll to effect",
            "onExit to exit",
            "matchEffect to exit",
            "matchEffect to effect",
            "uninterruptible",
          ),
          { maxLength: 5 },
        ),
        async (source, outcome, steps) => {
          // By a fiber: it waits for a reply that comes later.
          const fiberBuilt = build(source, outcome)
          const fiber = Effect.runFork(Effect.exit(steps.reduce(apply, fiberBuilt.effect)))
          fiberBuilt.settle()
          const byFiber = await Effect.runPromise(Fiber.join(fiber))
          // By plain calls: the outcome, or what a fiber runs from there.
          const built = build(source, outcome)
          let given: Effect.Effect<unknown, string> | undefined
          Observed.observe(steps.reduce(apply, built.effect), (result) => {
            given = result
          })
          built.settle()
          expect(given).toBeDefined()
          const byCall = await Effect.runPromise(Effect.exit(given!))
          expect(summary(byCall)).toEqual(summary(byFiber))
          // Plain all the way unless the source or a step needs a fiber.
          let state: Outcome | "fiber" = outcome
          for (const step of steps) {
            if (state === "fiber") break
            if (step === "catchAll to exit" && state === "failure") state = "success"
            else if (step === "catchAll to effect" && (state === "failure" || state === "failure and defect"))
              state = "fiber"
            else if (step === "catchAll to exit" && state === "failure and defect") state = "fiber"
            else if (step === "onExit to exit") state = state === "success" ? "success" : "failure"
            else if (step.startsWith("matchEffect") && state === "failure and defect") state = "fiber"
            else if (step === "matchEffect to exit" && state === "failure") state = "success"
            else if (step === "matchEffect to effect" && state === "failure") state = "fiber"
          }
          if (source !== "plain effect" && state !== "fiber") expect(Exit.isExit(given!)).toBe(true)
        },
      ),
    )
  })

  it("matchEffect gives what Effect.matchEffect gives, a failure with a defect included", async () => {
    const options = {
      onSuccess: (a: number) => Exit.succeed(`value ${a}`),
      onFailure: (e: string) => Effect.sync(() => `handled ${e}`),
    }
    for (const outcome of ["success", "failure", "defect", "failure and defect"] as const) {
      const expected = summary(
        await Effect.runPromise(
          Effect.exit(
            Effect.matchEffect(
              Effect.suspend(() => exitOf(outcome)),
              options,
            ),
          ),
        ),
      )
      const r = reply<number, string>()
      let given: Effect.Effect<string> | undefined
      Observed.observe(Observed.matchEffect(r.effect, options), (result) => (given = result))
      r.settle(exitOf(outcome))
      expect(summary(await Effect.runPromise(Effect.exit(given!)))).toEqual(expected)
      // A value, or a defect with no failure beside it, is read by plain calls.
      if (outcome === "success" || outcome === "defect") expect(Exit.isExit(given)).toBe(true)
    }
  })

  it("what an uninterruptible observed Effect hands on finishes, its fiber interrupted while it waited", async () => {
    for (const read of ["by a fiber", "by plain calls"] as const) {
      const r = reply<number, string>()
      let handled = false
      const effect = Observed.map(
        Observed.catchAll(Observed.uninterruptible(r.effect), () =>
          Effect.sync(() => {
            handled = true
            return 0
          }),
        ),
        (n) => n + 1,
      )
      if (read === "by a fiber") {
        const fiber = Effect.runFork(effect)
        await Effect.runPromise(Effect.yieldNow())
        const interrupted = Effect.runPromise(Fiber.interrupt(fiber))
        // The interruption delivered first: an interruptible wait would end here, its handler never run.
        await new Promise((resolve) => setTimeout(resolve, 20))
        r.settle(Exit.fail("no"))
        await interrupted
      } else {
        // What the plain read hands on runs on a fiber of its own, interrupted as soon as it starts.
        let handedOn: Promise<unknown> | undefined
        Observed.observe(effect, (result) => {
          const fiber = Effect.runFork(result)
          fiber.unsafeInterruptAsFork(FiberId.none)
          handedOn = Effect.runPromise(Fiber.await(fiber))
        })
        r.settle(Exit.fail("no"))
        await handedOn
      }
      // The handler ran: the interruption waited for the end of the uninterruptible work.
      expect(handled).toBe(true)
    }
  })

  it("a reply read later is read by callback, once, and the Effect form waits for the same outcome", () => {
    const r = reply<number, never>()
    const mapped = Observed.map(r.effect, (n) => n + 1)
    expect(Observed.isObservable(mapped)).toBe(true)
    const given: Array<Effect.Effect<number>> = []
    Observed.observe(mapped, (result) => given.push(result))
    expect(given).toEqual([])
    const waiting = Effect.runPromise(mapped)
    r.settle(Exit.succeed(41))
    expect(given.length).toBe(1)
    expect(
      Exit.isExit(given[0]) &&
        Exit.isSuccess(given[0] as Exit.Exit<number>) &&
        (given[0] as Exit.Success<number, never>).value,
    ).toBe(42)
    return expect(waiting).resolves.toBe(42)
  })

  it("a throw in a continuation is a defect, read by plain calls or run", () => {
    const boom = new Error("boom")
    const effect = Observed.map(Exit.succeed(1), () => {
      throw boom
    })
    let given: Effect.Effect<never> | undefined
    Observed.observe(effect, (result) => (given = result as Effect.Effect<never>))
    expect(Exit.isExit(given) && Exit.isFailure(given as Exit.Exit<never>)).toBe(true)
    const exit = Effect.runSync(Effect.exit(effect))
    expect(Exit.isFailure(exit) && Cause.defects(exit.cause).length).toBe(1)
  })

  it("an Effect of any other kind is handed on, to run on a fiber", () => {
    const plain = Effect.sync(() => 1)
    expect(Observed.isObservable(plain)).toBe(false)
    let given: Effect.Effect<number> | undefined
    Observed.observe(plain, (result) => (given = result))
    expect(given).toBe(plain)
  })
})
