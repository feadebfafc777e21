import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit } from "effect"
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
  | "uninterruptible"
type Outcome = "success" | "failure" | "defect"

const exitOf = (outcome: Outcome): Exit.Exit<number, string> =>
  outcome === "success"
    ? Exit.succeed(1)
    : outcome === "failure"
      ? Exit.fail("no")
      : Exit.die(new Error("bug"))

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
    case "uninterruptible":
      return Observed.uninterruptible(effect)
  }
}

const summary = (exit: Exit.Exit<unknown, string>) =>
  Exit.isSuccess(exit)
    ? { success: exit.value }
    : { failures: [...Cause.failures(exit.cause)], defects: Cause.defects(exit.cause).length }

describe("Observed", () => {
  it("an Effect read by plain calls gives what the same Effect run by a fiber gives", () => {
    fc.assert(
      fc.property(
        fc.constantFrom<Source>("exit", "reply now", "reply later", "plain effect"),
        fc.constantFrom<Outcome>("success", "failure", "defect"),
        fc.array(
          fc.constantFrom<Step>(
            "map",
            "asVoid",
            "catchAll to exit",
            "catchAll to effect",
            "onExit to exit",
            "uninterruptible",
          ),
          { maxLength: 5 },
        ),
        (source, outcome, steps) => {
          const run = (read: boolean) => {
            const built = build(source, outcome)
            const effect = steps.reduce(apply, built.effect)
            let given: Effect.Effect<unknown, string> | undefined
            if (read) Observed.observe(effect, (result) => (given = result))
            built.settle()
            if (!read) return { exit: Effect.runSync(Effect.exit(effect)), plain: false }
            expect(given).toBeDefined()
            // What was read is its Exit, or an Effect a fiber runs from there.
            return { exit: Effect.runSync(Effect.exit(given!)), plain: Exit.isExit(given!) }
          }
          const byFiber = run(false)
          const byCall = run(true)
          expect(summary(byCall.exit)).toEqual(summary(byFiber.exit))
          // Plain all the way unless the source or a step needs a fiber.
          let state: Outcome | "fiber" = outcome
          for (const step of steps) {
            if (state === "failure" && step === "catchAll to exit") state = "success"
            else if (state === "failure" && step === "catchAll to effect") state = "fiber"
            else if (state !== "fiber" && step === "onExit to exit")
              state = state === "success" ? "success" : "failure"
          }
          const needsFiber = source === "plain effect" || state === "fiber"
          if (!needsFiber) expect(byCall.plain).toBe(true)
        },
      ),
    )
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
