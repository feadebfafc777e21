import { describe, expect, it } from "@effect/vitest"
import {
  Cause,
  Chunk,
  Clock,
  Effect,
  Either,
  Exit,
  Fiber,
  FastCheck as fc,
  Option,
  Ref,
  Stream,
  TestClock,
} from "effect"
import {
  type GenerationInput,
  generate,
  makeProfiles,
  makeSimNode,
  makeSwarm,
  type NodeProfile,
  type SimClock,
  type SimEvent,
  SimNodeFailure,
  type SimPull,
} from "../src/index"

const input: GenerationInput = {
  messages: [{ role: "user", content: "How do rainbows form after a storm?" }],
  maxTokens: 1000,
  jsonMode: false,
}

const profile = (overrides: Partial<NodeProfile> = {}): NodeProfile => ({
  id: "sim-test",
  ttftMs: 200,
  ttftJitter: 0,
  tokensPerSecond: 50,
  capacity: 4,
  quality: 0.8,
  vision: false,
  failure: { refuse: 0, failBeforeFirstToken: 0, breakMidStream: 0, stall: 0 },
  ...overrides,
})

const failing = (failure: Partial<NodeProfile["failure"]>) =>
  profile({ failure: { refuse: 0, failBeforeFirstToken: 0, breakMidStream: 0, stall: 0, ...failure } })

const collect = (stream: Stream.Stream<SimEvent, SimNodeFailure>) =>
  Stream.runCollect(stream).pipe(Effect.map(Chunk.toReadonlyArray))

/** Records each event with the (test) time it arrived. */
const timeline = (stream: Stream.Stream<SimEvent, SimNodeFailure>) =>
  Effect.gen(function* () {
    const seen = yield* Ref.make<ReadonlyArray<readonly [number, SimEvent]>>([])
    const fiber = yield* stream.pipe(
      Stream.runForEach((event) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Ref.update(seen, (all) => [...all, [now, event] as const]),
        ),
      ),
      Effect.either,
      Effect.fork,
    )
    return { seen, fiber }
  })

const textOf = (events: ReadonlyArray<SimEvent>) =>
  events.flatMap((event) => (event._tag === "Piece" ? [event.text] : [])).join("")

describe("SimNode", () => {
  it.effect("streams the generated pieces then one Finish, without delay at infinite speed", () =>
    Effect.gen(function* () {
      const node = makeSimNode(profile(), { speed: Number.POSITIVE_INFINITY, seed: 1 })
      const seeded = { ...input, seed: 5 }
      const events = yield* collect(node.generate(seeded))
      // A sim node answers with its quality; a seed pins that to the reference quality.
      const expected = generate({ ...seeded, quality: 0.8 }, 0)
      expect(events.at(-1)).toEqual({ _tag: "Finish", reason: "stop" })
      expect(events.slice(0, -1)).toEqual(expected.pieces.map((text) => ({ _tag: "Piece", text })))
    }),
  )

  it.effect("reports length in the Finish event when maxTokens cuts the answer", () =>
    Effect.gen(function* () {
      const node = makeSimNode(profile(), { speed: Number.POSITIVE_INFINITY, seed: 1 })
      const events = yield* collect(node.generate({ ...input, maxTokens: 4 }))
      expect(events).toHaveLength(5)
      expect(events[4]).toEqual({ _tag: "Finish", reason: "length" })
    }),
  )

  it.effect("gives the same outputs for the same swarm seed and sequence of calls", () =>
    Effect.gen(function* () {
      const run = (seed: number) =>
        Effect.forEach(makeSwarm({ seed, speed: Number.POSITIVE_INFINITY }), (node) =>
          Effect.map(Effect.zip(collect(node.generate(input)), collect(node.generate(input))), ([a, b]) => [
            textOf(a),
            textOf(b),
          ]),
        )
      const first = yield* run(11)
      expect(first).toHaveLength(16)
      expect(yield* run(11)).toEqual(first)
      expect(yield* run(12)).not.toEqual(first)
      expect(new Set(first.flat()).size).toBeGreaterThan(28)
    }),
  )

  it.effect("waits ttft/speed for the first piece, then about 1000/tokensPerSecond/speed per piece", () =>
    Effect.gen(function* () {
      const node = makeSimNode(profile({ ttftMs: 200, tokensPerSecond: 50 }), { speed: 2, seed: 3 })
      const { fiber, seen } = yield* timeline(node.generate(input))
      yield* TestClock.adjust("99 millis")
      expect(yield* Ref.get(seen)).toEqual([])
      yield* TestClock.adjust("1 millis")
      expect((yield* Ref.get(seen)).map(([at]) => at)).toEqual([100])
      yield* TestClock.adjust("1 hour")
      expect(Either.isRight(yield* Fiber.join(fiber))).toBe(true)
      const times = (yield* Ref.get(seen)).map(([at]) => at)
      for (let i = 1; i < times.length - 1; i++) {
        const gap = times[i]! - times[i - 1]!
        expect(gap).toBeGreaterThanOrEqual(8 - 1e-9)
        expect(gap).toBeLessThanOrEqual(12 + 1e-9)
      }
      expect(times.at(-1)).toBe(times.at(-2))
    }),
  )

  it.effect("keeps the first piece within the profile's jitter", () =>
    Effect.gen(function* () {
      const node = makeSimNode(profile({ ttftMs: 300, ttftJitter: 0.5 }), { speed: 1, seed: 9 })
      for (let call = 0; call < 10; call++) {
        const start = yield* Clock.currentTimeMillis
        const { fiber, seen } = yield* timeline(node.generate({ ...input, maxTokens: 1 }))
        yield* TestClock.adjust("1 second")
        yield* Fiber.join(fiber)
        const first = (yield* Ref.get(seen))[0]![0] - start
        expect(first).toBeGreaterThanOrEqual(150)
        expect(first).toBeLessThanOrEqual(450)
      }
    }),
  )

  it.effect("refuses at once when refuse is certain", () =>
    Effect.gen(function* () {
      const node = makeSimNode(failing({ refuse: 1 }), { speed: 1, seed: 1 })
      const result = yield* Effect.either(collect(node.generate(input)))
      expect(result).toEqual(Either.left(new SimNodeFailure({ nodeId: "sim-test", reason: "refused" })))
    }),
  )

  it.effect("refuses images on a node without vision and accepts them on a vision node", () =>
    Effect.gen(function* () {
      const withImage = { ...input, images: [{ mediaType: "image/png", bytes: 10 }] }
      const blind = makeSimNode(profile(), { speed: Number.POSITIVE_INFINITY, seed: 1 })
      const seeing = makeSimNode(profile({ vision: true }), { speed: Number.POSITIVE_INFINITY, seed: 1 })
      const refused = yield* Effect.flip(collect(blind.generate(withImage)))
      expect(refused.reason).toBe("refused")
      expect(textOf(yield* collect(seeing.generate(withImage)))).toMatch(
        /^I see an image \(image\/png, 10 bytes\)/,
      )
    }),
  )

  it.effect("fails before the first token, after the ttft delay", () =>
    Effect.gen(function* () {
      const node = makeSimNode(failing({ failBeforeFirstToken: 1 }), { speed: 1, seed: 1 })
      const { fiber, seen } = yield* timeline(node.generate(input))
      yield* TestClock.adjust("199 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 millis")
      const result = yield* Fiber.join(fiber)
      expect(Either.isLeft(result) && result.left.reason).toBe("failed_before_first_token")
      expect(yield* Ref.get(seen)).toEqual([])
    }),
  )

  it.effect("breaks mid-stream after some but not all pieces", () =>
    Effect.gen(function* () {
      const node = makeSimNode(failing({ breakMidStream: 1 }), { speed: 1, seed: 1 })
      for (let call = 0; call < 5; call++) {
        const seeded = { ...input, seed: 1 }
        const { fiber, seen } = yield* timeline(node.generate(seeded))
        yield* TestClock.adjust("1 hour")
        const result = yield* Fiber.join(fiber)
        expect(Either.isLeft(result) && result.left.reason).toBe("broke_mid_stream")
        const events = (yield* Ref.get(seen)).map(([, event]) => event)
        expect(events.length).toBeGreaterThan(0)
        expect(events.length).toBeLessThan(generate(seeded, 0).pieces.length)
        expect(events.every((event) => event._tag === "Piece")).toBe(true)
      }
    }),
  )

  it.effect("stalls without completing until interrupted, then releases the generation", () =>
    Effect.gen(function* () {
      const node = makeSimNode(failing({ stall: 1 }), { speed: 1, seed: 1 })
      const { fiber, seen } = yield* timeline(node.generate(input))
      yield* TestClock.adjust("10 hours")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      expect((yield* Ref.get(seen)).every(([, event]) => event._tag === "Piece")).toBe(true)
      expect((yield* node.stats).active).toBe(1)
      yield* Fiber.interrupt(fiber)
      expect(yield* node.stats).toMatchObject({ started: 1, active: 0 })
    }),
  )

  it.effect("stops producing pieces as soon as the consumer is interrupted", () =>
    Effect.gen(function* () {
      const node = makeSimNode(profile({ ttftMs: 100, tokensPerSecond: 10 }), { speed: 1, seed: 1 })
      const { fiber, seen } = yield* timeline(node.generate(input))
      yield* TestClock.adjust("350 millis")
      const before = yield* node.stats
      expect(before.piecesEmitted).toBe(3)
      expect(before.active).toBe(1)
      yield* Fiber.interrupt(fiber)
      yield* TestClock.adjust("1 hour")
      expect(yield* node.stats).toEqual({ started: 1, active: 0, piecesEmitted: 3 })
      expect(yield* Ref.get(seen)).toHaveLength(3)
    }),
  )

  it.effect("re-rolls failures on every run of the same stream, so a retry can succeed", () =>
    Effect.gen(function* () {
      const node = makeSimNode(failing({ refuse: 0.5 }), { speed: Number.POSITIVE_INFINITY, seed: 4 })
      const stream = node.generate(input)
      const outcomes = yield* Effect.forEach(Array.from({ length: 40 }), () =>
        Effect.map(Effect.either(collect(stream)), Either.isRight),
      )
      expect(outcomes).toContain(true)
      expect(outcomes).toContain(false)
      expect((yield* node.stats).active).toBe(0)
    }),
  )

  it("builds a swarm of 16 nodes from the seeded profiles by default", () => {
    const swarm = makeSwarm({ seed: 5, speed: 1 })
    expect(swarm.map((node) => node.profile)).toEqual(makeProfiles({ seed: 5, count: 16 }))
    expect(makeSwarm({ seed: 5, count: 3, speed: 1 })).toHaveLength(3)
    expect(() => makeSwarm({ seed: 5, speed: 0 })).toThrow(RangeError)
  })

  describe("begin (by callback)", () => {
    /** A clock moved by hand: alarms fire in order of their time, then of their arming. */
    class ManualClock implements SimClock {
      time = 0
      private armed: Array<{ at: number; order: number; fire: () => void; live: boolean }> = []
      private order = 0
      readonly now = () => this.time
      readonly alarm = (millis: number, fire: () => void) => {
        const timer = { at: this.time + millis, order: this.order++, fire, live: true }
        this.armed.push(timer)
        return () => {
          timer.live = false
        }
      }
      /** Fires every alarm until none is left (a stall without an idle limit leaves none). */
      runAll() {
        for (;;) {
          const live = this.armed.filter((t) => t.live)
          if (live.length === 0) return
          const first = live.reduce((a, b) => (b.at < a.at || (b.at === a.at && b.order < a.order) ? b : a))
          first.live = false
          this.armed = live.filter((t) => t !== first)
          this.time = Math.max(this.time, first.at)
          first.fire()
        }
      }
    }

    /** What a reader saw: each chunk with its time, then how it ended ("pending" if it never did). */
    type Seen = { chunks: Array<readonly [number, ReadonlyArray<SimEvent>]>; end: string }
    const endOf = (exit: Exit.Exit<unknown, Option.Option<SimNodeFailure>>): string => {
      if (Exit.isSuccess(exit)) return "?"
      const failure = Cause.failureOption(exit.cause)
      return Option.isSome(failure) && Option.isSome(failure.value) ? failure.value.value.reason : "end"
    }

    const byEffect = (pull: SimPull, seen: Seen): Effect.Effect<void> =>
      Effect.flatMap(Effect.exit(pull), (exit) => {
        if (Exit.isFailure(exit)) {
          seen.end = endOf(exit)
          return Effect.void
        }
        return Effect.flatMap(Clock.currentTimeMillis, (now) => {
          seen.chunks.push([now, Chunk.toReadonlyArray(exit.value)])
          return byEffect(pull, seen)
        })
      })

    const arbitraryCase = fc.record({
      ttftMs: fc.integer({ min: 0, max: 400 }),
      ttftJitter: fc.constantFrom(0, 0.3),
      tokensPerSecond: fc.integer({ min: 5, max: 200 }),
      failure: fc.record({
        refuse: fc.constantFrom(0, 0.5, 1),
        failBeforeFirstToken: fc.constantFrom(0, 0.5),
        breakMidStream: fc.constantFrom(0, 0.5),
        stall: fc.constantFrom(0, 0.5),
        stallBeforeFirstToken: fc.constantFrom(0, 0.3),
      }),
      speed: fc.constantFrom(1, 3, 1000, Number.POSITIVE_INFINITY),
      seed: fc.nat(1000),
      maxTokens: fc.integer({ min: 0, max: 40 }),
      idleTimeoutMillis: fc.constantFrom(0, 250),
      generations: fc.integer({ min: 1, max: 3 }),
    })

    it.effect.prop(
      "reads every generation as `open` does: the same chunks at the same times, the same end, released by stop",
      [arbitraryCase],
      ([c]) =>
        Effect.gen(function* () {
          const made = () =>
            makeSimNode(
              profile({
                ttftMs: c.ttftMs,
                ttftJitter: c.ttftJitter,
                tokensPerSecond: c.tokensPerSecond,
                failure: c.failure,
              }),
              {
                speed: c.speed,
                seed: c.seed,
              },
            )
          const viaEffect = made()
          const viaCallback = made()
          const options = { idleTimeoutMillis: c.idleTimeoutMillis }
          const generation = { ...input, maxTokens: c.maxTokens }
          for (let i = 0; i < c.generations; i++) {
            const expected: Seen = { chunks: [], end: "pending" }
            const start = yield* Clock.currentTimeMillis
            yield* Effect.scoped(
              Effect.gen(function* () {
                const pull = yield* viaEffect.open(generation, options)
                const fiber = yield* Effect.fork(byEffect(pull, expected))
                yield* TestClock.adjust("10 hours")
                yield* Fiber.interrupt(fiber)
              }),
            )
            // Compared in microseconds: the test clock's arithmetic and ours round differently.
            const micros = (at: number) => Math.round(at * 1000)
            expected.chunks = expected.chunks.map(([at, events]) => [micros(at - start), events] as const)

            const clock = new ManualClock()
            const seen: Seen = { chunks: [], end: "pending" }
            const started = viaCallback.begin(generation, clock, options)
            const read = () =>
              started.next((exit) => {
                if (Exit.isFailure(exit)) {
                  seen.end = endOf(exit)
                  return
                }
                seen.chunks.push([micros(clock.time), Chunk.toReadonlyArray(exit.value)])
                read()
              })
            read()
            clock.runAll()
            expect((yield* viaCallback.stats).active).toBe(1)
            started.stop()
            started.stop()

            // The same events and end; each chunk at the same time, to a microsecond either way.
            expect(seen.end).toBe(expected.end)
            expect(seen.chunks.map(([, events]) => events)).toEqual(
              expected.chunks.map(([, events]) => events),
            )
            for (let c = 0; c < seen.chunks.length; c++)
              expect(Math.abs(seen.chunks[c]![0] - expected.chunks[c]![0])).toBeLessThanOrEqual(1)
            expect(yield* viaCallback.stats).toEqual(yield* viaEffect.stats)
          }
          expect((yield* viaCallback.stats).active).toBe(0)
        }),
      { fastCheck: { numRuns: 60 } },
    )

    it("stop cancels a waiting read's alarm and releases the generation", () => {
      const node = makeSimNode(profile({ ttftMs: 100 }), { speed: 1, seed: 2 })
      const fired: Array<number> = []
      let cancelled = 0
      const clock: SimClock = {
        now: () => 0,
        alarm: (millis) => {
          fired.push(millis)
          return () => {
            cancelled++
          }
        },
      }
      const started = node.begin(input, clock)
      started.next(() => expect.unreachable("read after stop"))
      expect(fired).toEqual([100])
      expect(Effect.runSync(node.stats).active).toBe(1)
      started.stop()
      expect(cancelled).toBe(1)
      expect(Effect.runSync(node.stats).active).toBe(0)
    })
  })
})
