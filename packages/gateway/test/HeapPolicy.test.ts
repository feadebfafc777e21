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
          cpus: 2,
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
            cpus: 2,
          })
          yield* TestClock.adjust(5_000)
        }),
      )
      expect(set).toEqual([])
    }),
  )

  it.effect(
    "on one CPU, scavenges on the main thread alone while few requests are open, in parallel while many are",
    () =>
      Effect.gen(function* () {
        let open = 0
        const set: Array<string> = []
        const scope = yield* Scope.make()
        yield* HeapPolicy.watch(() => open, { tightAt: 100, setFlags: (f) => set.push(f), cpus: 1 }).pipe(
          Scope.extend(scope),
        )
        expect(set).toEqual(["--no-parallel-scavenge"])
        open = 150
        yield* TestClock.adjust(1_000)
        expect(set.slice(1)).toEqual([
          `--heap-growing-percent=${HeapPolicy.TIGHT_GROWTH_PERCENT}`,
          "--parallel-scavenge",
        ])
        open = 10
        yield* TestClock.adjust(1_000)
        expect(set.slice(3)).toEqual(["--heap-growing-percent=0", "--no-parallel-scavenge"])
        yield* Scope.close(scope, Exit.void)
        expect(set.slice(5)).toEqual(["--parallel-scavenge"])
      }),
  )

  it.effect("on one CPU with the growth never tight, scavenges on the main thread alone until closed", () =>
    Effect.gen(function* () {
      const set: Array<string> = []
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* HeapPolicy.watch(() => 10_000, { tightAt: 0, setFlags: (f) => set.push(f), cpus: 1 })
          yield* TestClock.adjust(5_000)
          expect(set).toEqual(["--no-parallel-scavenge"])
        }),
      )
      expect(set).toEqual(["--no-parallel-scavenge", "--parallel-scavenge"])
    }),
  )

  it.effect("leaves the young generation's threads to an operator who chose them, however V8 spells it", () =>
    Effect.gen(function* () {
      const chosen = [
        "--parallel-scavenge",
        "--parallel_scavenge",
        "--no-parallel-scavenge",
        "--no_parallel_scavenge",
        "--noparallel-scavenge",
        "--single-threaded-gc",
        "--single_threaded_gc",
        "--no-single-threaded-gc",
        "--no_single_threaded_gc",
        "--nosingle-threaded-gc",
      ]
      for (const flag of chosen) {
        const set: Array<string> = []
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* HeapPolicy.watch(() => 500, {
              tightAt: 100,
              setFlags: (f) => set.push(f),
              execArgv: ["--max-old-space-size=512", flag],
              cpus: 1,
            })
            yield* TestClock.adjust(1_000)
          }),
        )
        // The growth is still the gateway's; the threads are not.
        expect(set, flag).toEqual([
          `--heap-growing-percent=${HeapPolicy.TIGHT_GROWTH_PERCENT}`,
          "--heap-growing-percent=0",
        ])
      }
      // A flag that only starts like one is not the operator's choice.
      const set: Array<string> = []
      yield* Effect.scoped(
        HeapPolicy.watch(() => 0, {
          tightAt: 100,
          setFlags: (f) => set.push(f),
          execArgv: ["--parallel-scavenge-task-trace"],
          cpus: 1,
        }),
      )
      expect(set).toEqual(["--no-parallel-scavenge", "--parallel-scavenge"])
    }),
  )
})
