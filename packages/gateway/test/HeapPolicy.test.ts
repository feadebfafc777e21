import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope, TestClock } from "effect"
import { HeapPolicy } from "../src"

describe("HeapPolicy", () => {
  it("tightens at the threshold, keeps it down to half, and releases below", () => {
    expect(HeapPolicy.shouldTighten(false, 255, 256)).toBe(false)
    expect(HeapPolicy.shouldTighten(false, 256, 256)).toBe(true)
    expect(HeapPolicy.shouldTighten(true, 128, 256)).toBe(true)
    expect(HeapPolicy.shouldTighten(true, 127, 256)).toBe(false)
    expect(HeapPolicy.shouldTighten(false, 10_000, 0)).toBe(false)
  })

  it.effect(
    "sets the growth as the open count crosses the threshold, and V8's own when the scope closes",
    () =>
      Effect.gen(function* () {
        let open = 0
        const set: Array<string> = []
        const scope = yield* Scope.make()
        yield* HeapPolicy.watch(() => open, {
          tightAt: 100,
          intervalMillis: 1_000,
          setFlags: (f) => set.push(f),
        }).pipe(Scope.extend(scope))
        yield* TestClock.adjust(1_000)
        expect(set).toEqual([])
        open = 150
        yield* TestClock.adjust(1_000)
        expect(set).toEqual([`--heap-growing-percent=${HeapPolicy.TIGHT_GROWTH_PERCENT}`])
        open = 60
        yield* TestClock.adjust(3_000)
        expect(set).toHaveLength(1)
        open = 49
        yield* TestClock.adjust(1_000)
        expect(set).toEqual([
          `--heap-growing-percent=${HeapPolicy.TIGHT_GROWTH_PERCENT}`,
          "--heap-growing-percent=0",
        ])
        open = 500
        yield* TestClock.adjust(1_000)
        expect(set).toHaveLength(3)
        yield* Scope.close(scope, Exit.void)
        expect(set.at(-1)).toBe("--heap-growing-percent=0")
        expect(set).toHaveLength(4)
      }),
  )

  it.effect("leaves an operator's own growth from the command line alone", () =>
    Effect.gen(function* () {
      const set: Array<string> = []
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* HeapPolicy.watch(() => 10_000, {
            tightAt: 100,
            setFlags: (f) => set.push(f),
            execArgv: ["--max-old-space-size=512", "--heap-growing-percent=10"],
          })
          yield* TestClock.adjust(5_000)
        }),
      )
      expect(set).toEqual([])
    }),
  )
})
