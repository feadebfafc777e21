import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import * as RootFibers from "../src/RootFibers"

describe("RootFibers.untrack", () => {
  it.effect("keeps root fibers started after it out of Fiber.roots, and its undo brings them back", () =>
    Effect.gen(function* () {
      const before = Effect.runFork(Effect.never)
      expect(yield* Fiber.roots).toContain(before)
      const undo = RootFibers.untrack()
      expect(undo).toBeDefined()
      const after = Effect.runFork(Effect.never)
      try {
        const roots = yield* Fiber.roots
        expect(roots).not.toContain(after)
        // Fibers tracked before it still leave the set when they end.
        expect(roots).toContain(before)
      } finally {
        undo?.()
      }
      const again = Effect.runFork(Effect.never)
      expect(yield* Fiber.roots).toContain(again)
      yield* Fiber.interrupt(before)
      yield* Fiber.interrupt(after)
      yield* Fiber.interrupt(again)
      const left = yield* Fiber.roots
      expect(left).not.toContain(before)
      expect(left).not.toContain(again)
    }),
  )
})
