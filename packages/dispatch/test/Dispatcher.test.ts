import { describe, expect, it } from "@effect/vitest"
import { CapacityExhausted } from "@swarmgate/protocol"
import { makeSimNode, makeSwarm, type NodeProfile, noFailures, type SimEvent } from "@swarmgate/swarm-sim"
import { Chunk, Deferred, Effect, Exit, Fiber, Option, Random, Ref, Scope, Stream, TestClock } from "effect"
import * as Dispatcher from "../src/Dispatcher"
import { type NodeEvent, NodeFailure, type NodeRequest, type SwarmNode } from "../src/NodeTransport"
import * as Presets from "../src/Presets"
import * as SimTransport from "../src/SimTransport"

// --- fixtures --------------------------------------------------------------------------------

// Most suites here test the single-node strategy; `-prime` defaults to consensus (the Swarm suite tests it).
const presets = Presets.defaultPresets("test").map(
  (preset): Presets.Preset => ({ ...preset, strategy: "single" }),
)
const prime = presets[0]!
const swift = presets[1]!

const request: Omit<NodeRequest, "model"> = {
  requestId: "req_test",
  messages: [{ role: "user", content: "How do rivers shape valleys?", images: [] }],
  maxTokens: 64,
  jsonMode: false,
  sampling: { temperature: 0.7, seed: 3 },
}

const delta = (text: string): NodeEvent => ({ _tag: "Delta", text })
const finish: NodeEvent = { _tag: "Finish", reason: "stop" }

interface FakeNode extends SwarmNode {
  /** Every request this node was asked to run, in order. */
  readonly calls: Array<NodeRequest>
}

/** A node whose streams are given by `events` (default: two deltas and a finish). */
const fakeNode = (
  id: string,
  options: {
    readonly capacity?: number
    readonly serves?: ReadonlyArray<string>
    readonly vision?: boolean
    readonly events?: (request: NodeRequest) => Stream.Stream<NodeEvent, NodeFailure>
  } = {},
): FakeNode => {
  const calls: Array<NodeRequest> = []
  const events = options.events ?? (() => Stream.make(delta(`${id}:`), delta("hello"), finish))
  return {
    id,
    capacity: options.capacity ?? 4,
    models: new Map((options.serves ?? [prime.id]).map((preset) => [preset, `${id}-${preset}`])),
    vision: options.vision ?? false,
    calls,
    generate: (request) =>
      Stream.suspend(() => {
        calls.push(request)
        return events(request)
      }),
  }
}

const failsAtOnce = (id: string) => () => Stream.fail(new NodeFailure({ nodeId: id, reason: "refused" }))
/** The first event, then silence: a generation that is still running. */
const hangs = () => Stream.concat(Stream.make(delta("…")), Stream.never)

const collect = (stream: Stream.Stream<NodeEvent, NodeFailure>) =>
  Effect.map(Stream.runCollect(stream), Chunk.toReadonlyArray)

/** Runs the request and reads the whole stream inside a scope of its own. */
const runToEnd = (dispatcher: Dispatcher.DispatcherShape, preset = prime) =>
  Effect.scoped(
    Effect.flatMap(dispatcher.run(preset, request), (run) =>
      Effect.map(collect(run.events), (events) => ({ nodeId: run.nodeId, events })),
    ),
  )

/** Runs the request and leaves it running in `scope`: its slot stays taken. */
const hold = (dispatcher: Dispatcher.DispatcherShape, scope: Scope.Scope, preset = prime) =>
  Scope.extend(dispatcher.run(preset, request), scope)

const seeded = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.withRandom(effect, Random.make("dispatch"))

const countBy = (ids: ReadonlyArray<string>) => {
  const counts: Record<string, number> = {}
  for (const id of ids) counts[id] = (counts[id] ?? 0) + 1
  return counts
}

// --- tests ------------------------------------------------------------------------------------

describe("lookups", () => {
  it("lists the presets and finds one by id", () => {
    const dispatcher = Dispatcher.make(presets, [])
    expect(dispatcher.presets.map((p) => p.id)).toEqual(["test-prime", "test-swift"])
    expect(dispatcher.preset("test-swift")).toBe(swift)
    expect(dispatcher.preset("gpt-4o")).toBeUndefined()
  })

  it("default presets: <brand>-prime with vision and <brand>-swift without, with fixed creation times", () => {
    const [p, s] = Presets.defaultPresets()
    expect(p).toMatchObject({ id: "swarm-prime", ownedBy: "swarm", vision: true, strategy: "consensus" })
    expect(s).toMatchObject({ id: "swarm-swift", ownedBy: "swarm", vision: false, strategy: "single" })
    expect(s!.maxContextTokens).toBeLessThan(p!.maxContextTokens)
    expect(p!.maxOutputTokens).toBeLessThanOrEqual(p!.maxContextTokens)
    expect(Presets.defaultPresets()).toEqual(Presets.defaultPresets())
  })

  it("nodesFor gives the nodes that serve a preset, none for an unknown one", () => {
    const a = fakeNode("a", { serves: [prime.id, swift.id] })
    const b = fakeNode("b", { serves: [prime.id] })
    const c = fakeNode("c", { serves: [swift.id] })
    const dispatcher = Dispatcher.make(presets, [a, b, c])
    expect(dispatcher.nodesFor(prime.id).map((n) => n.id)).toEqual(["a", "b"])
    expect(dispatcher.nodesFor(swift.id).map((n) => n.id)).toEqual(["a", "c"])
    expect(dispatcher.nodesFor("nope")).toEqual([])
    expect(dispatcher.inFlight("a")).toBe(0)
    expect(dispatcher.inFlight("nope")).toBe(0)
  })

  it.effect("sends the request with the node's own model name for the preset", () =>
    Effect.gen(function* () {
      const a = fakeNode("a", { serves: [prime.id, swift.id] })
      const dispatcher = Dispatcher.make(presets, [a])
      yield* runToEnd(dispatcher, swift)
      expect(a.calls).toEqual([{ ...request, model: "a-test-swift", idleTimeoutMillis: 30_000 }])
    }),
  )
})

describe("node selection", () => {
  it.effect("of two free nodes, always takes the less loaded", () =>
    Effect.gen(function* () {
      // `a` also serves swift: load it there, then watch prime requests avoid it.
      const a = fakeNode("a", { capacity: 10, serves: [prime.id, swift.id], events: hangs })
      const b = fakeNode("b", { capacity: 10, events: hangs })
      const dispatcher = Dispatcher.make(presets, [a, b])
      const scope = yield* Scope.make()
      for (let i = 0; i < 5; i++) yield* hold(dispatcher, scope, swift)
      const picks: Array<string> = []
      for (let i = 0; i < 5; i++) picks.push((yield* hold(dispatcher, scope)).nodeId)
      expect(picks).toEqual(["b", "b", "b", "b", "b"])
      expect([dispatcher.inFlight("a"), dispatcher.inFlight("b")]).toEqual([5, 5])
      yield* Scope.close(scope, Exit.void)
    }).pipe(seeded),
  )

  it.effect("power of two choices: a heavily loaded node gets far fewer new requests", () =>
    Effect.gen(function* () {
      const loaded = fakeNode("loaded", { capacity: 200, serves: [prime.id, swift.id], events: hangs })
      const others = ["n1", "n2", "n3"].map((id) => fakeNode(id, { capacity: 200, events: hangs }))
      const dispatcher = Dispatcher.make(presets, [loaded, ...others])
      const scope = yield* Scope.make()
      for (let i = 0; i < 100; i++) yield* hold(dispatcher, scope, swift)
      const picks: Array<string> = []
      for (let i = 0; i < 400; i++) picks.push((yield* hold(dispatcher, scope)).nodeId)
      const counts = countBy(picks)
      // Uniformly random choice would give it ~100 of 400.
      expect(counts.loaded ?? 0).toBeLessThan(50)
      for (const node of others) expect(counts[node.id]).toBeGreaterThan(counts.loaded ?? 0)
      // Loads end up close: every node within a few requests of the mean.
      for (const node of [loaded, ...others])
        expect(Math.abs(dispatcher.inFlight(node.id) - 125)).toBeLessThan(10)
      yield* Scope.close(scope, Exit.void)
    }).pipe(seeded),
  )

  it.effect("never picks a node at capacity", () =>
    Effect.gen(function* () {
      const small = fakeNode("small", { capacity: 1, serves: [prime.id, swift.id], events: hangs })
      const big = fakeNode("big", { capacity: 50, events: hangs })
      const dispatcher = Dispatcher.make(presets, [small, big])
      const scope = yield* Scope.make()
      expect((yield* hold(dispatcher, scope, swift)).nodeId).toBe("small")
      for (let i = 0; i < 50; i++) expect((yield* hold(dispatcher, scope)).nodeId).toBe("big")
      expect(small.calls).toHaveLength(1)
      expect([dispatcher.inFlight("small"), dispatcher.inFlight("big")]).toEqual([1, 50])
      yield* Scope.close(scope, Exit.void)
    }).pipe(seeded),
  )

  it.effect(
    "concurrent requests never take more than a node's capacity, even when fibers yield mid-pick",
    () =>
      Effect.gen(function* () {
        const a = fakeNode("a", { capacity: 3, events: hangs })
        const b = fakeNode("b", { capacity: 2, events: hangs })
        const dispatcher = Dispatcher.make(presets, [a, b])
        const scope = yield* Scope.make()
        // Yielding every few operations lets other fibers run between choosing a node and taking its slot.
        const exits = yield* Effect.all(
          Array.from({ length: 20 }, () => Effect.exit(hold(dispatcher, scope))),
          { concurrency: "unbounded" },
        ).pipe(Effect.withMaxOpsBeforeYield(10))
        expect(exits.filter(Exit.isSuccess)).toHaveLength(5)
        expect(a.calls.length + b.calls.length).toBe(5)
        expect([dispatcher.inFlight("a"), dispatcher.inFlight("b")]).toEqual([3, 2])
        yield* Scope.close(scope, Exit.void)
        expect([dispatcher.inFlight("a"), dispatcher.inFlight("b")]).toEqual([0, 0])
      }),
  )

  it.effect("with every node full, fails with 429 capacity_exhausted and a Retry-After of at least 1 s", () =>
    Effect.gen(function* () {
      const a = fakeNode("a", { capacity: 2, events: hangs })
      const b = fakeNode("b", { capacity: 1, events: hangs })
      const dispatcher = Dispatcher.make(presets, [a, b])
      const scope = yield* Scope.make()
      for (let i = 0; i < 3; i++) yield* hold(dispatcher, scope)
      const error = yield* Effect.flip(runToEnd(dispatcher))
      expect(error).toBeInstanceOf(CapacityExhausted)
      if (!(error instanceof CapacityExhausted)) return
      expect(error.retryAfterSeconds).toBeGreaterThanOrEqual(1)
      expect(error.retryAfter).toBeGreaterThanOrEqual(1)
      expect([error.status, error.code]).toEqual([429, "capacity_exhausted"])
      expect(error.message).toContain("test-prime")
      expect(a.calls.length + b.calls.length).toBe(3)
      // A freed slot admits the next request.
      yield* Scope.close(scope, Exit.void)
      expect(["a", "b"]).toContain((yield* Effect.scoped(dispatcher.run(prime, request))).nodeId)
    }),
  )

  it.effect("a preset without nodes is capacity_exhausted too", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [fakeNode("a", { serves: [prime.id] })])
      expect(yield* Effect.flip(runToEnd(dispatcher, swift))).toBeInstanceOf(CapacityExhausted)
    }),
  )
})

describe("slots", () => {
  it.effect("are held while the scope is open and released when it closes after success", () =>
    Effect.gen(function* () {
      const a = fakeNode("a")
      const dispatcher = Dispatcher.make(presets, [a])
      const events = yield* Effect.scoped(
        Effect.gen(function* () {
          const run = yield* dispatcher.run(prime, request)
          expect(dispatcher.inFlight("a")).toBe(1)
          const events = yield* collect(run.events)
          expect(dispatcher.inFlight("a")).toBe(1)
          return events
        }),
      )
      expect(events).toEqual([delta("a:"), delta("hello"), finish])
      expect(dispatcher.inFlight("a")).toBe(0)
    }),
  )

  it.effect("are released when the stream fails after its first event", () =>
    Effect.gen(function* () {
      const a = fakeNode("a", {
        events: () =>
          Stream.concat(
            Stream.make(delta("partial")),
            Stream.fail(new NodeFailure({ nodeId: "a", reason: "lost" })),
          ),
      })
      const dispatcher = Dispatcher.make(presets, [a])
      const seen = yield* Ref.make<ReadonlyArray<NodeEvent>>([])
      const exit = yield* Effect.exit(
        Effect.scoped(
          Effect.flatMap(dispatcher.run(prime, request), (run) =>
            Stream.runForEach(run.events, (event) => Ref.update(seen, (all) => [...all, event])),
          ),
        ),
      )
      expect(exit).toEqual(Exit.fail(new NodeFailure({ nodeId: "a", reason: "lost" })))
      expect(yield* Ref.get(seen)).toEqual([delta("partial")])
      // Failed after its first event: not retried.
      expect(a.calls).toHaveLength(1)
      expect(dispatcher.inFlight("a")).toBe(0)
    }),
  )

  it.effect("are released, and the node stream stopped, when the request is interrupted mid-stream", () =>
    Effect.gen(function* () {
      const started = yield* Deferred.make<void>()
      const stopped = yield* Ref.make(false)
      const a = fakeNode("a", {
        events: () =>
          Stream.concat(
            Stream.make(delta("first")),
            Stream.fromEffect(Effect.zipRight(Deferred.succeed(started, undefined), Effect.never)),
          ).pipe(Stream.ensuring(Ref.set(stopped, true))),
      })
      const dispatcher = Dispatcher.make(presets, [a])
      const fiber = yield* Effect.fork(
        Effect.scoped(Effect.flatMap(dispatcher.run(prime, request), (run) => Stream.runDrain(run.events))),
      )
      yield* Deferred.await(started)
      expect(dispatcher.inFlight("a")).toBe(1)
      yield* Fiber.interrupt(fiber)
      expect(dispatcher.inFlight("a")).toBe(0)
      expect(yield* Ref.get(stopped)).toBe(true)
    }),
  )

  it.effect("are released when the request is interrupted before the first event", () =>
    Effect.gen(function* () {
      const started = yield* Deferred.make<void>()
      const a = fakeNode("a", {
        events: () => Stream.fromEffect(Effect.zipRight(Deferred.succeed(started, undefined), Effect.never)),
      })
      const dispatcher = Dispatcher.make(presets, [a])
      const fiber = yield* Effect.fork(Effect.scoped(dispatcher.run(prime, request)))
      yield* Deferred.await(started)
      expect(dispatcher.inFlight("a")).toBe(1)
      yield* Fiber.interrupt(fiber)
      expect(dispatcher.inFlight("a")).toBe(0)
    }),
  )

  it.effect("are released once per request: closing one scope leaves the other's slot", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [fakeNode("a", { events: hangs })])
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      yield* hold(dispatcher, first)
      yield* hold(dispatcher, second)
      expect(dispatcher.inFlight("a")).toBe(2)
      yield* Scope.close(first, Exit.void)
      yield* Scope.close(first, Exit.void)
      expect(dispatcher.inFlight("a")).toBe(1)
      yield* Scope.close(second, Exit.void)
      expect(dispatcher.inFlight("a")).toBe(0)
    }),
  )
})

describe("retries before the first event", () => {
  it.effect("a node failing before its first event is replaced by another, invisibly, its slot freed", () =>
    Effect.gen(function* () {
      const bad = fakeNode("bad", { events: failsAtOnce("bad") })
      const good = fakeNode("good")
      const dispatcher = Dispatcher.make(presets, [bad, good])
      for (let i = 0; i < 12; i++) {
        yield* Effect.scoped(
          Effect.gen(function* () {
            const run = yield* dispatcher.run(prime, request)
            expect(run.nodeId).toBe("good")
            expect([dispatcher.inFlight("bad"), dispatcher.inFlight("good")]).toEqual([0, 1])
            expect(yield* collect(run.events)).toEqual([delta("good:"), delta("hello"), finish])
          }),
        )
      }
      // Both nodes were free and equally loaded: the bad one came first about half the time.
      expect(bad.calls.length).toBeGreaterThan(0)
      expect(good.calls).toHaveLength(12)
      expect([dispatcher.inFlight("bad"), dispatcher.inFlight("good")]).toEqual([0, 0])
    }).pipe(seeded),
  )

  it.effect("empty chunks before a failure still count as before the first event", () =>
    Effect.gen(function* () {
      const bad = fakeNode("bad", {
        events: () =>
          Stream.make(delta("dropped")).pipe(
            Stream.filter(() => false), // emits an empty chunk
            Stream.concat(Stream.fail(new NodeFailure({ nodeId: "bad", reason: "refused" }))),
          ),
      })
      const good = fakeNode("good")
      const dispatcher = Dispatcher.make(presets, [bad, good])
      for (let i = 0; i < 12; i++) expect((yield* runToEnd(dispatcher)).nodeId).toBe("good")
      expect(bad.calls.length).toBeGreaterThan(0)
    }).pipe(seeded),
  )

  it.effect(
    "tries at most maxAttempts nodes, each once, then fails with 429 capacity_exhausted and Retry-After",
    () =>
      Effect.gen(function* () {
        const nodes = ["f1", "f2", "f3", "f4", "f5"].map((id) => fakeNode(id, { events: failsAtOnce(id) }))
        const dispatcher = Dispatcher.make(presets, nodes, { maxAttempts: 3 })
        const error = yield* Effect.flip(runToEnd(dispatcher))
        // Nothing was generated: capacity (spec §7.3 rules 5–6), not 502.
        expect(error).toBeInstanceOf(CapacityExhausted)
        if (!(error instanceof CapacityExhausted)) return
        expect([error.status, error.code]).toEqual([429, "capacity_exhausted"])
        expect(error.retryAfter).toBeGreaterThanOrEqual(1)
        expect(error.retryAfter).toBeLessThanOrEqual(60)
        const tried = nodes.filter((n) => n.calls.length > 0)
        expect(tried).toHaveLength(3)
        for (const node of tried) expect(node.calls).toHaveLength(1)
        for (const node of nodes) expect(dispatcher.inFlight(node.id)).toBe(0)
      }).pipe(seeded),
  )

  it.effect("with fewer nodes than attempts, tries each node once", () =>
    Effect.gen(function* () {
      const nodes = ["f1", "f2"].map((id) => fakeNode(id, { events: failsAtOnce(id) }))
      const dispatcher = Dispatcher.make(presets, nodes, { maxAttempts: 5 })
      expect(yield* Effect.flip(runToEnd(dispatcher))).toBeInstanceOf(CapacityExhausted)
      expect(nodes.map((n) => n.calls.length)).toEqual([1, 1])
    }),
  )

  it.effect("maxAttempts 1 means no retry", () =>
    Effect.gen(function* () {
      const nodes = ["f1", "f2"].map((id) => fakeNode(id, { events: failsAtOnce(id) }))
      const dispatcher = Dispatcher.make(presets, nodes, { maxAttempts: 1 })
      expect(yield* Effect.flip(runToEnd(dispatcher))).toBeInstanceOf(CapacityExhausted)
      expect(nodes[0]!.calls.length + nodes[1]!.calls.length).toBe(1)
    }),
  )
})

describe("the returned stream", () => {
  it.effect("yields the first event, then the rest, from one generation", () =>
    Effect.gen(function* () {
      const a = fakeNode("a", {
        events: () =>
          Stream.fromChunks(
            Chunk.make(delta("one")),
            Chunk.make(delta(" two"), delta(" three")),
            Chunk.of(finish),
          ),
      })
      const dispatcher = Dispatcher.make(presets, [a])
      expect((yield* runToEnd(dispatcher)).events).toEqual([
        delta("one"),
        delta(" two"),
        delta(" three"),
        finish,
      ])
      expect(a.calls).toHaveLength(1)
    }),
  )

  it.effect("run returns only once the first event exists", () =>
    Effect.gen(function* () {
      const a = fakeNode("a", {
        events: () =>
          Stream.concat(
            Stream.fromEffect(Effect.as(Effect.sleep("1 second"), delta("late"))),
            Stream.make(finish),
          ),
      })
      const dispatcher = Dispatcher.make(presets, [a])
      const fiber = yield* Effect.fork(runToEnd(dispatcher))
      yield* TestClock.adjust("999 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      expect(dispatcher.inFlight("a")).toBe(1)
      yield* TestClock.adjust("1 milli")
      expect((yield* Fiber.join(fiber)).events).toEqual([delta("late"), finish])
    }),
  )
})

// --- the simulated swarm through the transport ----------------------------------------------

const profile = (overrides: Partial<NodeProfile> = {}): NodeProfile => ({
  id: "sim-t",
  ttftMs: 200,
  ttftJitter: 0,
  tokensPerSecond: 50,
  capacity: 3,
  quality: 0.8,
  vision: false,
  failure: noFailures,
  ...overrides,
})

const fast = { speed: Number.POSITIVE_INFINITY, seed: 11 }

const toNodeEvent = (event: SimEvent): NodeEvent =>
  event._tag === "Piece" ? delta(event.text) : { _tag: "Finish", reason: event.reason }

const nodeRequest: NodeRequest = { ...request, model: "sim-test-prime" }

const textOf = (events: ReadonlyArray<NodeEvent>) =>
  events.flatMap((event) => (event._tag === "Delta" ? [event.text] : [])).join("")

describe("SimTransport", () => {
  it("describes a sim node: id, capacity, vision, a model name per preset", () => {
    const node = SimTransport.fromSimNode(makeSimNode(profile({ vision: true, capacity: 7 }), fast), presets)
    expect(node).toMatchObject({ id: "sim-t", capacity: 7, vision: true })
    expect([...node.models]).toEqual([
      ["test-prime", "sim-test-prime"],
      ["test-swift", "sim-test-swift"],
    ])
  })

  it.effect("maps Piece to Delta and Finish to Finish, event for event", () =>
    Effect.gen(function* () {
      // Two identical nodes: one read directly, one through the transport.
      const direct = makeSimNode(profile(), fast)
      const viaTransport = SimTransport.fromSimNode(makeSimNode(profile(), fast), presets)
      const expected = yield* direct
        .generate({
          messages: [{ role: "user", content: "How do rivers shape valleys?" }],
          maxTokens: 64,
          jsonMode: false,
          seed: 3,
          temperature: 0.7,
        })
        .pipe(Stream.runCollect, Effect.map(Chunk.toReadonlyArray))
      const events = yield* collect(viaTransport.generate(nodeRequest))
      expect(events).toEqual(expected.map(toNodeEvent))
      expect(events.at(-1)?._tag).toBe("Finish")
      expect(events.length).toBeGreaterThan(2)
    }),
  )

  it.effect("passes sampling through: the same seed gives the same text on any node", () =>
    Effect.gen(function* () {
      const [a, b] = SimTransport.makeSimSwarm(
        { seed: 5, count: 2, speed: Number.POSITIVE_INFINITY },
        presets,
      )
      const first = yield* collect(a!.generate(nodeRequest))
      const second = yield* collect(b!.generate(nodeRequest))
      expect(textOf(second)).toBe(textOf(first))
      const stopped = yield* collect(
        a!.generate({ ...nodeRequest, sampling: { seed: 3, stop: [textOf(first).split(" ")[2]!] } }),
      )
      expect(textOf(first).startsWith(textOf(stopped))).toBe(true)
      expect(textOf(stopped).length).toBeLessThan(textOf(first).length)
    }),
  )

  it.effect("maps the sim's failures to NodeFailure with the node id and the reason", () =>
    Effect.gen(function* () {
      const failing = (failure: Partial<NodeProfile["failure"]>) =>
        SimTransport.fromSimNode(
          makeSimNode(profile({ failure: { ...noFailures, ...failure } }), fast),
          presets,
        )
      expect(yield* Effect.flip(collect(failing({ refuse: 1 }).generate(nodeRequest)))).toEqual(
        new NodeFailure({ nodeId: "sim-t", reason: "refused" }),
      )
      expect(yield* Effect.flip(collect(failing({ failBeforeFirstToken: 1 }).generate(nodeRequest)))).toEqual(
        new NodeFailure({ nodeId: "sim-t", reason: "failed_before_first_token" }),
      )
      const seen: Array<NodeEvent> = []
      const broken = yield* Effect.flip(
        Stream.runForEach(failing({ breakMidStream: 1 }).generate(nodeRequest), (event) =>
          Effect.sync(() => seen.push(event)),
        ),
      )
      expect(broken).toEqual(new NodeFailure({ nodeId: "sim-t", reason: "broke_mid_stream" }))
      expect(seen.length).toBeGreaterThan(0)
      expect(seen.every((event) => event._tag === "Delta")).toBe(true)
    }),
  )

  it.effect("sends images: a node without vision refuses them", () =>
    Effect.gen(function* () {
      const blind = SimTransport.fromSimNode(makeSimNode(profile({ vision: false }), fast), presets)
      const seeing = SimTransport.fromSimNode(makeSimNode(profile({ vision: true }), fast), presets)
      const withImage: NodeRequest = {
        ...nodeRequest,
        messages: [
          {
            role: "user",
            content: "What is in this picture?",
            images: [{ url: "https://example.com/a.png", mediaType: "image/png", bytes: 1000 }],
          },
        ],
      }
      expect(yield* Effect.flip(collect(blind.generate(withImage)))).toEqual(
        new NodeFailure({ nodeId: "sim-t", reason: "refused" }),
      )
      expect((yield* collect(seeing.generate(withImage))).at(-1)?._tag).toBe("Finish")
    }),
  )

  it.effect("a sim node failing before its first token is retried on another through the dispatcher", () =>
    Effect.gen(function* () {
      const flaky = makeSimNode(
        profile({ id: "sim-flaky", failure: { ...noFailures, failBeforeFirstToken: 1 } }),
        fast,
      )
      const steady = makeSimNode(profile({ id: "sim-steady" }), fast)
      const dispatcher = Dispatcher.make(
        presets,
        [flaky, steady].map((node) => SimTransport.fromSimNode(node, presets)),
      )
      for (let i = 0; i < 10; i++) {
        const { nodeId, events } = yield* runToEnd(dispatcher)
        expect(nodeId).toBe("sim-steady")
        expect(events.at(-1)?._tag).toBe("Finish")
      }
      expect((yield* flaky.stats).started).toBeGreaterThan(0)
      expect((yield* flaky.stats).active).toBe(0)
      expect(dispatcher.inFlight("sim-flaky") + dispatcher.inFlight("sim-steady")).toBe(0)
    }).pipe(seeded),
  )

  it.effect("the same swarm seed and dispatcher seed give the same nodes and the same answers", () =>
    Effect.gen(function* () {
      const session = (swarmSeed: number) =>
        Effect.gen(function* () {
          const nodes = SimTransport.makeSimSwarm(
            { seed: swarmSeed, count: 8, speed: Number.POSITIVE_INFINITY },
            presets,
          )
          const dispatcher = Dispatcher.make(presets, nodes)
          const runs: Array<readonly [string, string]> = []
          for (let i = 0; i < 10; i++) {
            // No sampling seed: the text comes from each node's own seeded draws.
            const run = yield* Effect.scoped(
              Effect.flatMap(
                dispatcher.run(prime, { ...request, requestId: `req_${i}`, sampling: { temperature: 1 } }),
                (run) => Effect.map(collect(run.events), (events) => [run.nodeId, textOf(events)] as const),
              ),
            )
            runs.push(run)
          }
          return { profiles: nodes.map((n) => [n.id, n.capacity, n.vision]), runs }
        }).pipe(Effect.withRandom(Random.make("dispatch")))
      const one = yield* session(42)
      const two = yield* session(42)
      expect(two).toEqual(one)
      expect(new Set(one.runs.map(([nodeId]) => nodeId)).size).toBeGreaterThan(1)
      const other = yield* session(43)
      expect(other.profiles).not.toEqual(one.profiles)
    }),
  )

  it.effect("at real speed, run waits for the node's time to first token (TestClock)", () =>
    Effect.gen(function* () {
      const node = SimTransport.fromSimNode(
        makeSimNode(profile({ ttftMs: 200 }), { speed: 1, seed: 1 }),
        presets,
      )
      const dispatcher = Dispatcher.make(presets, [node])
      const fiber = yield* Effect.fork(Effect.scoped(dispatcher.run(prime, request)))
      yield* TestClock.adjust("199 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 milli")
      expect((yield* Fiber.join(fiber)).nodeId).toBe("sim-t")
      expect(dispatcher.inFlight("sim-t")).toBe(0)
    }),
  )

  it("makeSimSwarm: as many nodes as asked, from the swarm-sim profiles", () => {
    const nodes = SimTransport.makeSimSwarm({ seed: 42, count: 16, speed: 1 }, presets)
    const sims = makeSwarm({ seed: 42, count: 16, speed: 1 })
    expect(nodes.map((n) => [n.id, n.capacity, n.vision])).toEqual(
      sims.map((s) => [s.profile.id, s.profile.capacity, s.profile.vision]),
    )
  })
})

describe("consensus holds bounded answers", () => {
  const consensus = Presets.defaultPresets("test").map(
    (preset): Presets.Preset => ({
      ...preset,
      strategy: "consensus",
      consensus: { ...preset.consensus, k: 2, quorum: 2, judges: 0 },
    }),
  )[0]!

  it.effect("an author that ignores max_tokens is read only just past the cap, then cut", () =>
    Effect.gen(function* () {
      let sent = 0
      // Endless one-token deltas: without a bound the gateway would hold all of them.
      const endless = () =>
        Stream.repeatEffect(
          Effect.sync(() => {
            sent++
            return delta(" the")
          }),
        )
      const a = fakeNode("a", { events: endless })
      const b = fakeNode("b", { events: endless })
      const dispatcher = Dispatcher.make([consensus], [a, b])
      const { events } = yield* runToEnd(dispatcher, consensus)
      const deltas = events.filter((e) => e._tag === "Delta")
      expect(deltas.length).toBe(request.maxTokens + 1)
      expect(events.at(-1)).toEqual({ _tag: "Finish", reason: "length" })
      expect(sent).toBeLessThan(4 * request.maxTokens)
      expect(dispatcher.inFlight("a") + dispatcher.inFlight("b")).toBe(0)
    }).pipe(seeded),
  )
})
