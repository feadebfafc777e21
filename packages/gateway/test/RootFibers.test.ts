import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import * as RootFibers from "../src/RootFibers"

describe("RootFibers.untrack", () => {
  it.effect("keeps fibers started after it out of Fiber.roots, and its undo brings them back", () =>
    Effect.gen(function* () {
      const before = Effect.runFork(Effect.never)
      expect(yield* Fiber.roots).toContain(before)
      const undo = RootFibers.untrack()
      expect(undo).toBeDefined()
      let after: Fiber.RuntimeFiber<never, never> | undefined
      try {
        after = Effect.runFork(Effect.never)
        const roots = yield* Fiber.roots
        expect(roots).not.toContain(after)
        expect(roots).toContain(before)
      } finally {
        undo?.()
      }
      const again = Effect.runFork(Effect.never)
      expect(yield* Fiber.roots).toContain(again)
      yield* Fiber.interrupt(before)
      if (after !== undefined) yield* Fiber.interrupt(after)
      yield* Fiber.interrupt(again)
      // Fibers tracked before it (or after its undo) still leave the set when they end.
      const left = yield* Fiber.roots
      expect(left).not.toContain(before)
      expect(left).not.toContain(again)
    }),
  )

  it.effect("nested: each undo puts back what its call found", () =>
    Effect.gen(function* () {
      const outer = RootFibers.untrack()
      const inner = RootFibers.untrack()
      inner?.()
      const stillOff = Effect.runFork(Effect.never)
      const offRoots = yield* Fiber.roots
      outer?.()
      const on = Effect.runFork(Effect.never)
      const onRoots = yield* Fiber.roots
      yield* Fiber.interrupt(stillOff)
      yield* Fiber.interrupt(on)
      expect(offRoots).not.toContain(stillOff)
      expect(onRoots).toContain(on)
    }),
  )
})
