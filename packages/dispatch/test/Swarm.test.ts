/**
 * The dispatcher's swarm behaviour: hedging, the dispatch queue, circuit
 * breakers with probes, membership, and the consensus strategy. Fake nodes
 * under TestClock where timing matters, simulated nodes for consensus.
 */
import { describe, expect, it } from "@effect/vitest"
import { CapacityExhausted } from "@swarmgate/protocol"
import { makeProfiles, makeSimNode } from "@swarmgate/swarm-sim"
import { Chunk, Effect, Either, Exit, Fiber, Option, Random, Scope, Stream, TestClock } from "effect"
import * as Dispatcher from "../src/Dispatcher"
import type { NodeSpec } from "../src/NodesFile"
import { type NodeEvent, NodeFailure, type NodeRequest, type SwarmNode } from "../src/NodeTransport"
import * as Presets from "../src/Presets"
import * as SimTransport from "../src/SimTransport"
import { runLevel } from "./support/ConsensusExperiment"

// Most suites here test the single-node strategy; `-prime` defaults to consensus (see consensusPreset).
const presets = Presets.defaultPresets("test").map(
  (preset): Presets.Preset => ({ ...preset, strategy: "single" }),
)
const prime = presets[0]!
const consensusPreset: Presets.Preset = {
  ...prime,
  strategy: "consensus",
  consensus: { k: 3, quorum: 2, judges: 3, deadlineMillis: 5_000 },
}

const request: Omit<NodeRequest, "model"> = {
  requestId: "req_swarm",
  messages: [{ role: "user", content: "How do glaciers carve valleys?", images: [] }],
  maxTokens: 200,
  jsonMode: false,
  sampling: { temperature: 0.7 },
}

const delta = (text: string): NodeEvent => ({ _tag: "Delta", text })
const finish: NodeEvent = { _tag: "Finish", reason: "stop" }

interface FakeNode extends SwarmNode {
  calls: number
  /** Streams of this node that were stopped before they ended. */
  stopped: number
}

/** A node whose first event comes after `ttft(call)` ms (Infinity: never), then a few more. */
const timedNode = (
  id: string,
  ttft: (call: number) => number,
  options: { capacity?: number; probe?: SwarmNode["probe"] } = {},
): FakeNode => {
  const node: FakeNode = {
    id,
    capacity: options.capacity ?? 4,
    models: new Map([[prime.id, id]]),
    vision: false,
    calls: 0,
    stopped: 0,
    probe: options.probe,
    generate: () =>
      Stream.suspend(() => {
        const delay = ttft(node.calls++)
        let ended = false
        const first = Number.isFinite(delay)
          ? Stream.fromEffect(Effect.as(Effect.sleep(delay), delta(`${id}:`)))
          : Stream.never
        return Stream.concat(first, Stream.make(delta("done"), finish)).pipe(
          Stream.onEnd(Effect.sync(() => (ended = true))),
          Stream.ensuring(
            Effect.sync(() => {
              if (!ended) node.stopped++
            }),
          ),
        )
      }),
  }
  return node
}

/** A node that fails before its first token while `down()` says so. */
const flakyNode = (id: string, down: () => boolean, probe?: SwarmNode["probe"]): FakeNode => {
  const node: FakeNode = {
    id,
    capacity: 4,
    models: new Map([[prime.id, id]]),
    vision: false,
    calls: 0,
    stopped: 0,
    probe,
    generate: () =>
      Stream.suspend(() => {
        node.calls++
        return down()
          ? Stream.fail(new NodeFailure({ nodeId: id, reason: "refused" }))
          : Stream.make(delta(`${id}:`), finish)
      }),
  }
  return node
}

const runToEnd = (dispatcher: Dispatcher.DispatcherShape, preset = prime) =>
  Effect.scoped(
    Effect.flatMap(dispatcher.run(preset, request), (run) =>
      Effect.map(Stream.runCollect(run.events), (events) => ({
        nodeId: run.nodeId,
        events: Chunk.toReadonlyArray(events),
      })),
    ),
  )

const seeded = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.withRandom(effect, Random.make("swarm"))

const statusOf = (dispatcher: Dispatcher.DispatcherShape, id: string) =>
  Effect.map(dispatcher.status, (all) => all.find((n) => n.id === id))

describe("hedging", () => {
  it.effect(
    "a first token later than the threshold starts a second node; the first token wins, the other is cancelled",
    () =>
      Effect.gen(function* () {
        // The big node is cheaper for power-of-two choices, so it is always tried first.
        const slow = timedNode("slow", () => 5_000, { capacity: 100 })
        const fast = timedNode("fast", () => 100, { capacity: 1 })
        const dispatcher = Dispatcher.make(presets, [slow, fast], { hedgeAfterMillis: 300 })
        const fiber = yield* Effect.fork(runToEnd(dispatcher))
        yield* TestClock.adjust("299 millis")
        expect([slow.calls, fast.calls]).toEqual([1, 0])
        yield* TestClock.adjust("1 milli")
        expect([slow.calls, fast.calls]).toEqual([1, 1])
        expect([dispatcher.inFlight("slow"), dispatcher.inFlight("fast")]).toEqual([1, 1])
        yield* TestClock.adjust("100 millis")
        const result = yield* Fiber.join(fiber)
        expect(result.nodeId).toBe("fast")
        expect(result.events).toEqual([delta("fast:"), delta("done"), finish])
        expect(slow.stopped).toBe(1)
        expect([dispatcher.inFlight("slow"), dispatcher.inFlight("fast")]).toEqual([0, 0])
        const slowStatus = (yield* statusOf(dispatcher, "slow"))!
        expect(slowStatus.hedges).toBe(1)
        // The loser's lateness counts against it, not as a failure.
        expect(slowStatus.ttftMillis).toBe(400)
        expect(slowStatus.failures).toBe(0)
      }).pipe(seeded),
  )

  it.effect("the first node keeps the request when its token comes before the hedge's", () =>
    Effect.gen(function* () {
      const first = timedNode("first", () => 500, { capacity: 100 })
      const second = timedNode("second", () => 1_000, { capacity: 1 })
      const dispatcher = Dispatcher.make(presets, [first, second], { hedgeAfterMillis: 300 })
      const fiber = yield* Effect.fork(runToEnd(dispatcher))
      yield* TestClock.adjust("500 millis")
      expect((yield* Fiber.join(fiber)).nodeId).toBe("first")
      expect(second.calls).toBe(1)
      expect(second.stopped).toBe(1)
      expect(dispatcher.inFlight("second")).toBe(0)
    }).pipe(seeded),
  )

  it.effect("once a node has history, its own p95 is the threshold", () =>
    Effect.gen(function* () {
      // Ten quick answers in 100 ms, then a slow one.
      const main = timedNode("main", (call) => (call < 10 ? 100 : 10_000), { capacity: 100 })
      const backup = timedNode("backup", () => 10, { capacity: 1 })
      const dispatcher = Dispatcher.make(presets, [main, backup], { hedgeAfterMillis: 5_000 })
      for (let i = 0; i < 10; i++) {
        const fiber = yield* Effect.fork(runToEnd(dispatcher))
        yield* TestClock.adjust("100 millis")
        expect((yield* Fiber.join(fiber)).nodeId).toBe("main")
      }
      expect(backup.calls).toBe(0)
      const fiber = yield* Effect.fork(runToEnd(dispatcher))
      yield* TestClock.adjust("99 millis")
      expect(backup.calls).toBe(0)
      yield* TestClock.adjust("1 milli")
      expect(backup.calls).toBe(1)
      yield* TestClock.adjust("10 millis")
      expect((yield* Fiber.join(fiber)).nodeId).toBe("backup")
    }).pipe(seeded),
  )

  it.effect("hedgeAfterMillis 0 disables hedging", () =>
    Effect.gen(function* () {
      const slow = timedNode("slow", () => 5_000, { capacity: 100 })
      const fast = timedNode("fast", () => 1, { capacity: 1 })
      const dispatcher = Dispatcher.make(presets, [slow, fast], { hedgeAfterMillis: 0 })
      const fiber = yield* Effect.fork(runToEnd(dispatcher))
      yield* TestClock.adjust("5 seconds")
      expect((yield* Fiber.join(fiber)).nodeId).toBe("slow")
      expect(fast.calls).toBe(0)
    }).pipe(seeded),
  )

  it.effect("a node with no first token by firstTokenTimeoutMillis has failed: the request moves on", () =>
    Effect.gen(function* () {
      const stuck = timedNode("stuck", () => Number.POSITIVE_INFINITY, { capacity: 100 })
      const ok = timedNode("ok", () => 10, { capacity: 1 })
      const dispatcher = Dispatcher.make(presets, [stuck, ok], {
        hedgeAfterMillis: 0,
        firstTokenTimeoutMillis: 1_000,
      })
      const fiber = yield* Effect.fork(runToEnd(dispatcher))
      yield* TestClock.adjust("1010 millis")
      expect((yield* Fiber.join(fiber)).nodeId).toBe("ok")
      expect((yield* statusOf(dispatcher, "stuck"))!.lastFailure).toMatch(/^timeout: no first token/)
    }).pipe(seeded),
  )

  it.effect("a stream silent for idleTimeoutMillis after it started fails as stalled", () =>
    Effect.gen(function* () {
      const node: SwarmNode = {
        id: "stalls",
        capacity: 1,
        models: new Map([[prime.id, "m"]]),
        vision: false,
        generate: () => Stream.concat(Stream.make(delta("a")), Stream.never),
      }
      const dispatcher = Dispatcher.make(presets, [node], { idleTimeoutMillis: 2_000 })
      const fiber = yield* Effect.fork(Effect.either(runToEnd(dispatcher)))
      yield* TestClock.adjust("2 seconds")
      const result = yield* Fiber.join(fiber)
      expect(result).toEqual(Either.left(new NodeFailure({ nodeId: "stalls", reason: "stalled" })))
    }),
  )
})

describe("the dispatch queue", () => {
  const hangs = (id: string, capacity: number): FakeNode =>
    timedNode(id, () => Number.POSITIVE_INFINITY, { capacity })
  const holding = (id: string, capacity: number): SwarmNode => ({
    id,
    capacity,
    models: new Map([[prime.id, id]]),
    vision: false,
    generate: () => Stream.concat(Stream.make(delta("x")), Stream.never),
  })

  it.effect(
    "with every node busy, waits up to queueWaitMillis, then 429 capacity_exhausted with Retry-After",
    () =>
      Effect.gen(function* () {
        const dispatcher = Dispatcher.make(presets, [holding("only", 1)], {
          queueWaitMillis: 1_500,
          hedgeAfterMillis: 0,
        })
        const scope = yield* Scope.make()
        yield* Scope.extend(dispatcher.run(prime, request), scope)
        const waiting = yield* Effect.fork(Effect.either(Effect.scoped(dispatcher.run(prime, request))))
        yield* TestClock.adjust("1499 millis")
        expect(Option.isNone(yield* Fiber.poll(waiting))).toBe(true)
        yield* TestClock.adjust("1 milli")
        const result = yield* Fiber.join(waiting)
        expect(Either.isLeft(result) && result.left).toBeInstanceOf(CapacityExhausted)
        if (Either.isLeft(result) && result.left instanceof CapacityExhausted) {
          expect(result.left.retryAfterSeconds).toBe(2)
          expect(result.left.retryAfter).toBeLessThanOrEqual(60)
        }
        yield* Scope.close(scope, Exit.void)
      }),
  )

  it.effect("a slot freed while a request waits goes to that request", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [holding("only", 1)], {
        queueWaitMillis: 1_000,
        hedgeAfterMillis: 0,
      })
      const scope = yield* Scope.make()
      yield* Scope.extend(dispatcher.run(prime, request), scope)
      const waiting = yield* Effect.fork(
        Effect.scoped(Effect.map(dispatcher.run(prime, request), (run) => run.nodeId)),
      )
      yield* TestClock.adjust("300 millis")
      yield* Scope.close(scope, Exit.void)
      expect(yield* Fiber.join(waiting)).toBe("only")
    }),
  )

  it.effect("the queue is bounded: past queueMax waiting requests, refused at once", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [holding("only", 1)], {
        queueWaitMillis: 10_000,
        queueMax: 1,
        hedgeAfterMillis: 0,
      })
      const scope = yield* Scope.make()
      yield* Scope.extend(dispatcher.run(prime, request), scope)
      const first = yield* Effect.fork(Effect.either(Effect.scoped(dispatcher.run(prime, request))))
      yield* TestClock.adjust("1 milli")
      const second = yield* Effect.either(Effect.scoped(dispatcher.run(prime, request)))
      expect(Either.isLeft(second) && second.left).toBeInstanceOf(CapacityExhausted)
      expect(Option.isNone(yield* Fiber.poll(first))).toBe(true)
      yield* Fiber.interrupt(first)
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.effect("a request no node could ever serve is refused without waiting", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [hangs("text-only", 2)], { queueWaitMillis: 60_000 })
      const withImage = {
        ...request,
        messages: [
          {
            role: "user" as const,
            content: "?",
            images: [{ url: "https://x/a.png", mediaType: "image/png", bytes: 0 }],
          },
        ],
      }
      expect(yield* Effect.flip(Effect.scoped(dispatcher.run(prime, withImage)))).toBeInstanceOf(
        CapacityExhausted,
      )
      expect(yield* Effect.flip(Effect.scoped(dispatcher.run(presets[1]!, request)))).toBeInstanceOf(
        CapacityExhausted,
      )
    }),
  )
})

describe("circuit breakers", () => {
  it.effect(
    "a failing node is circuit-broken after three failures and gets no traffic; its probe closes it again",
    () =>
      Effect.gen(function* () {
        let down = true
        const probe = Effect.suspend(() =>
          down ? Effect.fail(new NodeFailure({ nodeId: "flaky", reason: "probe refused" })) : Effect.void,
        )
        const flaky = flakyNode("flaky", () => down, probe)
        const steady = flakyNode("steady", () => false)
        const dispatcher = Dispatcher.make(presets, [{ ...flaky, capacity: 100 }, steady], {
          health: { openMillis: 1_000 },
          probeIntervalMillis: 500,
        })
        for (let i = 0; i < 20; i++) expect((yield* runToEnd(dispatcher)).nodeId).toBe("steady")
        expect(flaky.calls).toBe(3)
        expect((yield* statusOf(dispatcher, "flaky"))!.circuit).toBe("open")
        // Cool-down over, the probe still fails: open again, for longer.
        yield* TestClock.adjust("1 second")
        yield* dispatcher.maintain
        expect((yield* statusOf(dispatcher, "flaky"))!.circuit).toBe("open")
        for (let i = 0; i < 5; i++) yield* runToEnd(dispatcher)
        expect(flaky.calls).toBe(3)
        // Recovered: the next probe closes the circuit and traffic returns.
        down = false
        yield* TestClock.adjust("2 seconds")
        yield* dispatcher.maintain
        expect((yield* statusOf(dispatcher, "flaky"))!.circuit).toBe("closed")
        const picks = new Set<string>()
        for (let i = 0; i < 20; i++) picks.add((yield* runToEnd(dispatcher)).nodeId)
        expect(picks.has("flaky")).toBe(true)
      }).pipe(seeded),
  )

  it.effect("without a probe, the first request after the cool-down is the half-open trial", () =>
    Effect.gen(function* () {
      let down = true
      const flaky = flakyNode("flaky", () => down)
      const steady = flakyNode("steady", () => false)
      const dispatcher = Dispatcher.make(presets, [{ ...flaky, capacity: 100 }, steady], {
        health: { openMillis: 1_000 },
      })
      for (let i = 0; i < 5; i++) yield* runToEnd(dispatcher)
      expect(flaky.calls).toBe(3)
      down = false
      yield* TestClock.adjust("1 second")
      expect((yield* runToEnd(dispatcher)).nodeId).toBe("flaky")
      expect((yield* statusOf(dispatcher, "flaky"))!.circuit).toBe("closed")
    }).pipe(seeded),
  )

  it.effect("failures after the first token count too", () =>
    Effect.gen(function* () {
      const breaks: SwarmNode = {
        id: "breaks",
        capacity: 4,
        models: new Map([[prime.id, "m"]]),
        vision: false,
        generate: () =>
          Stream.concat(
            Stream.make(delta("a")),
            Stream.fail(new NodeFailure({ nodeId: "breaks", reason: "lost" })),
          ),
      }
      const dispatcher = Dispatcher.make(presets, [breaks])
      for (let i = 0; i < 3; i++) yield* Effect.either(runToEnd(dispatcher))
      const status = (yield* statusOf(dispatcher, "breaks"))!
      expect([status.circuit, status.failures, status.lastFailure]).toEqual(["open", 3, "lost"])
      expect(yield* Effect.flip(runToEnd(dispatcher))).toBeInstanceOf(CapacityExhausted)
    }),
  )

  it.effect("every node failing before its first token is 429 capacity_exhausted, free of charge", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [flakyNode("a", () => true), flakyNode("b", () => true)])
      expect(yield* Effect.flip(runToEnd(dispatcher))).toBeInstanceOf(CapacityExhausted)
    }),
  )
})

describe("membership", () => {
  const made: Array<NodeSpec> = []
  const makeNode = (spec: NodeSpec): SwarmNode => {
    made.push(spec)
    return {
      ...flakyNode(spec.id, () => false),
      capacity: spec.capacity,
      models: new Map(Object.entries(spec.models)),
    }
  }
  const spec = (id: string, capacity = 2): NodeSpec => ({
    id,
    url: `http://10.0.0.1:8000/${id}`,
    models: { [prime.id]: `${id}-model` },
    capacity,
  })

  it.effect("registers a node, renews it on heartbeat, and drains it when the heartbeats stop", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [], { makeNode, registrationTtlMillis: 10_000 })
      expect(yield* Effect.flip(runToEnd(dispatcher))).toBeInstanceOf(CapacityExhausted)
      const first = yield* dispatcher.register(spec("gpu-1"))
      expect(Either.getOrThrow(first).created).toBe(true)
      expect(Either.getOrThrow(first).node).toMatchObject({
        id: "gpu-1",
        source: "registered",
        state: "active",
        expiresAt: 10_000,
      })
      expect(dispatcher.nodesFor(prime.id).map((n) => n.id)).toEqual(["gpu-1"])
      expect((yield* runToEnd(dispatcher)).nodeId).toBe("gpu-1")
      yield* TestClock.adjust("8 seconds")
      const renewed = Either.getOrThrow(yield* dispatcher.register(spec("gpu-1"), 5_000))
      expect([renewed.created, renewed.node.expiresAt]).toEqual([false, 13_000])
      expect(made).toHaveLength(1)
      yield* TestClock.adjust("5001 millis")
      yield* dispatcher.maintain
      expect(yield* dispatcher.status).toEqual([])
      expect(dispatcher.nodesFor(prime.id)).toEqual([])
    }),
  )

  it.effect("a changed registration replaces the node but keeps its health", () =>
    Effect.gen(function* () {
      made.length = 0
      const dispatcher = Dispatcher.make(presets, [], { makeNode })
      yield* dispatcher.register(spec("gpu-1", 2))
      yield* runToEnd(dispatcher)
      const updated = Either.getOrThrow(yield* dispatcher.register(spec("gpu-1", 8)))
      expect(made).toHaveLength(2)
      expect([updated.node.capacity, updated.node.requests]).toEqual([8, 1])
    }),
  )

  it.effect("nodes of the nodes file cannot be taken over by a registration", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [flakyNode("static-1", () => false)], { makeNode })
      expect(Either.isLeft(yield* dispatcher.register(spec("static-1")))).toBe(true)
    }),
  )

  it.effect("drain: no new requests, running ones finish, then the node is gone", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(presets, [
        flakyNode("one", () => false),
        flakyNode("other", () => false),
      ])
      const scope = yield* Scope.make()
      const run = yield* Scope.extend(dispatcher.run(prime, request), scope)
      const held = run.nodeId
      const drained = yield* dispatcher.drain(held)
      expect(drained).toMatchObject({ state: "draining", inFlight: 1 })
      for (let i = 0; i < 5; i++) expect((yield* runToEnd(dispatcher)).nodeId).not.toBe(held)
      expect((yield* statusOf(dispatcher, held))?.state).toBe("draining")
      yield* Scope.close(scope, Exit.void)
      expect(yield* statusOf(dispatcher, held)).toBeUndefined()
      expect(yield* dispatcher.drain("nope")).toBeUndefined()
    }).pipe(seeded),
  )
})

describe("strategy consensus", () => {
  const simSwarm = (count: number, options: { dishonest?: number; seed?: number } = {}) => {
    const profiles = makeProfiles({ seed: options.seed ?? 5, count, dishonest: options.dishonest ?? 0 })
    return profiles.map((profile) =>
      SimTransport.fromSimNode(makeSimNode(profile, { speed: Number.POSITIVE_INFINITY, seed: 5 }), [
        consensusPreset,
      ]),
    )
  }

  it.effect("k nodes answer, judges from outside the authors compare them, the winner streams", () =>
    Effect.gen(function* () {
      const traces: Array<Dispatcher.ConsensusTrace> = []
      const nodes = simSwarm(8)
      const dispatcher = Dispatcher.make([consensusPreset], nodes, { onConsensus: (t) => traces.push(t) })
      const { events, nodeId } = yield* runToEnd(dispatcher, consensusPreset)
      const [trace] = traces as [Dispatcher.ConsensusTrace]
      expect(trace.answers).toHaveLength(3)
      expect(nodeId).toBe(`consensus:${trace.answers.map((a) => a.nodeId).join(",")}`)
      const text = events.map((e) => (e._tag === "Delta" ? e.text : "")).join("")
      expect(text).toBe(trace.candidates[trace.winner]!.text)
      expect(events.at(-1)?._tag).toBe("Finish")
      // Three judges, three pairs each, none of them an author.
      expect(trace.votes).toHaveLength(9)
      const authors = new Set(trace.answers.map((a) => a.nodeId))
      for (const vote of trace.votes) expect(authors.has(vote.judge)).toBe(false)
      expect(trace.candidates[trace.winner]!.strength).toBe(
        Math.max(...trace.candidates.map((c) => c.strength)),
      )
      // Every slot is free again; the judges' reputations moved.
      for (const node of nodes) expect(dispatcher.inFlight(node.id)).toBe(0)
      const moved = (yield* dispatcher.status).filter((n) => n.reputation !== 0.75)
      expect(moved.length).toBeGreaterThan(0)
    }).pipe(seeded),
  )

  it.effect("identical answers (a pinned seed) need no judges", () =>
    Effect.gen(function* () {
      const traces: Array<Dispatcher.ConsensusTrace> = []
      const dispatcher = Dispatcher.make([consensusPreset], simSwarm(6), {
        onConsensus: (t) => traces.push(t),
      })
      yield* Effect.scoped(
        Effect.flatMap(dispatcher.run(consensusPreset, { ...request, sampling: { seed: 3 } }), (run) =>
          Stream.runDrain(run.events),
        ),
      )
      expect(traces[0]!.candidates).toHaveLength(1)
      expect(traces[0]!.votes).toEqual([])
    }).pipe(seeded),
  )

  it.effect("after the deadline a quorum is enough: a stalled author is cancelled", () =>
    Effect.gen(function* () {
      const answers = (id: string, ttft: number): FakeNode => timedNode(id, () => ttft)
      const nodes = [answers("a", 100), answers("b", 200), answers("never", Number.POSITIVE_INFINITY)]
      const traces: Array<Dispatcher.ConsensusTrace> = []
      const preset = {
        ...consensusPreset,
        consensus: { ...consensusPreset.consensus, judges: 0, deadlineMillis: 1_000 },
      }
      const dispatcher = Dispatcher.make([preset], nodes, { onConsensus: (t) => traces.push(t) })
      const fiber = yield* Effect.fork(runToEnd(dispatcher, preset))
      yield* TestClock.adjust("999 millis")
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* TestClock.adjust("1 milli")
      yield* Fiber.join(fiber)
      expect(traces[0]!.answers.map((a) => a.nodeId).sort()).toEqual(["a", "b"])
      expect(nodes[2]!.stopped).toBe(1)
      expect(dispatcher.inFlight("never")).toBe(0)
    }).pipe(seeded),
  )

  it.effect("authors that fail are replaced; with no answer at all it is 429 capacity_exhausted", () =>
    Effect.gen(function* () {
      const dispatcher = Dispatcher.make(
        [consensusPreset],
        ["a", "b", "c", "d"].map((id) => flakyNode(id, () => true)),
      )
      expect(yield* Effect.flip(runToEnd(dispatcher, consensusPreset))).toBeInstanceOf(CapacityExhausted)
      const empty = Dispatcher.make([consensusPreset], [])
      expect(yield* Effect.flip(runToEnd(empty, consensusPreset))).toBeInstanceOf(CapacityExhausted)
    }),
  )

  it.effect(
    "with 20% dishonest, colluding nodes it picks the best answer more often than every baseline",
    () =>
      Effect.gen(function* () {
        const result = yield* runLevel({ seed: 11, nodes: 20, dishonest: 0.2, trials: 120 })
        expect(result.trials).toBe(120)
        for (const baseline of ["random", "majority", "reputation"] as const)
          expect(result.rates.consensus).toBeGreaterThan(result.rates[baseline] + 0.1)
        expect(result.ringWins.consensus).toBeLessThan(result.ringWins.majority)
      }),
    20_000,
  )
})

/**
 * `runIn` takes the request's scope as a value: the gateway runs every request
 * on a runtime whose context has no `Scope`. Run here with none in context
 * either (`it.effect` provides none), so a read of `Scope` from the context
 * anywhere on the way — the strategy, an attempt, a node's stream, the hedge
 * alarm under TestClock, consensus — fails the test instead of passing.
 */
describe("runIn: the scope is given, none is read from the fiber's context", () => {
  const runInOwnScope = (dispatcher: Dispatcher.DispatcherShape, preset: Presets.Preset) =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const run = yield* dispatcher.runIn(scope, preset, request)
      const events = Chunk.toReadonlyArray(yield* Stream.runCollect(run.events))
      yield* Scope.close(scope, Exit.void)
      return { nodeId: run.nodeId, events }
    })

  it.effect("single, through a hedge: the alarm, both attempts and the loser's cancel", () =>
    Effect.gen(function* () {
      const slow = timedNode("slow", () => 5_000, { capacity: 100 })
      const fast = timedNode("fast", () => 100, { capacity: 1 })
      const dispatcher = Dispatcher.make(presets, [slow, fast], { hedgeAfterMillis: 300 })
      const fiber = yield* Effect.fork(runInOwnScope(dispatcher, prime))
      yield* TestClock.adjust("400 millis")
      const result = yield* Fiber.join(fiber)
      expect(result.nodeId).toBe("fast")
      expect(result.events).toEqual([delta("fast:"), delta("done"), finish])
      expect(slow.stopped).toBe(1)
      expect([dispatcher.inFlight("slow"), dispatcher.inFlight("fast")]).toEqual([0, 0])
    }),
  )

  it.effect("single on simulated nodes, and consensus", () =>
    Effect.gen(function* () {
      const profiles = makeProfiles({ seed: 5, count: 8, dishonest: 0 })
      const nodes = profiles.map((profile) =>
        SimTransport.fromSimNode(makeSimNode(profile, { speed: Number.POSITIVE_INFINITY, seed: 5 }), [prime]),
      )
      const single = yield* runInOwnScope(Dispatcher.make(presets, nodes), prime)
      expect(single.events.at(-1)?._tag).toBe("Finish")
      const voting = profiles.map((profile) =>
        SimTransport.fromSimNode(makeSimNode(profile, { speed: Number.POSITIVE_INFINITY, seed: 5 }), [
          consensusPreset,
        ]),
      )
      const consensus = yield* runInOwnScope(Dispatcher.make([consensusPreset], voting), consensusPreset)
      expect(consensus.nodeId.startsWith("consensus:")).toBe(true)
      expect(consensus.events.at(-1)?._tag).toBe("Finish")
    }),
  )
})

/**
 * `beginIn`: the single strategy by plain calls, as the gateway's common
 * request runs it. A node started by callback whose first event comes first
 * gives the run as an `Exit` (no Effect step); anything else hands over the
 * Effect loop from the state the plain start left, which ends as `runIn`
 * would: the next node after a failure, the hedge's winner, 429 when none is
 * free. Real clock, nodes that answer by timers.
 */
describe("beginIn: the single strategy by plain calls, the Effect loop where it must wait", () => {
  /** A node started by callback: its first event after `first(call).ttft` ms (or a failure), then the rest. */
  const callbackNode = (
    id: string,
    first: (call: number) => { readonly ttft: number; readonly fail?: boolean },
    capacity = 4,
  ): FakeNode => {
    const node: FakeNode = {
      id,
      capacity,
      models: new Map([[prime.id, id]]),
      vision: false,
      calls: 0,
      stopped: 0,
      enforcesIdleTimeout: true,
      generate: () => Stream.die("started by callback only"),
      begin: (_request, onFirst) => {
        const { ttft, fail } = first(node.calls++)
        let rest: Array<NodeEvent> = [delta("done"), finish]
        let over = false
        const timer = Number.isFinite(ttft)
          ? setTimeout(() => {
              if (fail) over = true
              onFirst(
                fail
                  ? Exit.fail(Option.some(new NodeFailure({ nodeId: id, reason: "broken" })))
                  : Exit.succeed(Chunk.of(delta(`${id}:`))),
              )
            }, ttft)
          : undefined
        const take = (): Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> => {
          if (rest.length === 0) {
            over = true
            return Exit.fail(Option.none())
          }
          const chunk = Chunk.fromIterable(rest)
          rest = []
          return Exit.succeed(chunk)
        }
        return {
          pull: Effect.suspend(take),
          next: (done) => {
            done(take())
            return () => undefined
          },
          stop: () => {
            clearTimeout(timer)
            if (!over) node.stopped++
            over = true
          },
        }
      },
    }
    return node
  }

  /** Begins the request; how it was handed on (plain or not), then its events read by callback. */
  const begin = (dispatcher: Dispatcher.DispatcherShape) =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      // On no fiber, as the gateway's plain request begins it: the runtime only gives the services.
      const runtime = yield* Effect.runtime<never>()
      const begun = yield* Effect.async<Effect.Effect<Dispatcher.NodeRun, unknown>>((resume) =>
        dispatcher.beginIn(scope, runtime, prime, request, (result) => resume(Effect.succeed(result))),
      )
      const result = yield* Effect.either(begun)
      if (Either.isLeft(result)) {
        yield* Scope.close(scope, Exit.void)
        return { plain: Exit.isExit(begun), failure: result.left, nodeId: undefined, events: [] }
      }
      const run = result.right
      const events: Array<NodeEvent> = []
      while (true) {
        const chunk = yield* Effect.async<Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>>(
          (resume) => {
            run.next!((exit) => resume(Effect.succeed(exit)))
          },
        )
        if (Exit.isFailure(chunk)) break
        events.push(...chunk.value)
      }
      yield* Scope.close(scope, Exit.void)
      return { plain: Exit.isExit(begun), failure: undefined, nodeId: run.nodeId, events }
    })

  it.live("a node free now whose first event comes first: the run by plain calls", () =>
    Effect.gen(function* () {
      const node = callbackNode("a", () => ({ ttft: 5 }))
      const dispatcher = Dispatcher.make(presets, [node])
      const result = yield* begin(dispatcher)
      expect(result.plain).toBe(true)
      expect(result.events).toEqual([delta("a:"), delta("done"), finish])
      expect(dispatcher.inFlight("a")).toBe(0)
    }),
  )

  it.live("a failure before the first event: handed over, the next node answers", () =>
    Effect.gen(function* () {
      const broken = callbackNode("broken", () => ({ ttft: 5, fail: true }))
      const good = callbackNode("good", () => ({ ttft: 5 }))
      // Only the broken node is free at first; the good one comes free for the replacement.
      const dispatcher = Dispatcher.make(presets, [broken, good])
      let result = yield* begin(dispatcher)
      for (let i = 0; i < 20 && broken.calls === 0; i++) result = yield* begin(dispatcher)
      expect(broken.calls).toBeGreaterThan(0)
      expect(result.plain).toBe(false)
      expect(result.nodeId).toBe("good")
      expect(result.events).toEqual([delta("good:"), delta("done"), finish])
      expect([dispatcher.inFlight("broken"), dispatcher.inFlight("good")]).toEqual([0, 0])
    }),
  )

  it.live("a late first event: handed over to the hedge, whose node wins; the late one is stopped", () =>
    Effect.gen(function* () {
      const slow = callbackNode("slow", () => ({ ttft: Number.POSITIVE_INFINITY }), 100)
      const fast = callbackNode("fast", () => ({ ttft: 5 }), 1)
      const dispatcher = Dispatcher.make(presets, [slow, fast], { hedgeAfterMillis: 30, hedgeMinMillis: 30 })
      // Until the first attempt lands on the slow node (the choice is random).
      let result = yield* begin(dispatcher)
      while (result.nodeId === "fast" && slow.calls === 0) result = yield* begin(dispatcher)
      expect(result.plain).toBe(false)
      expect(result.nodeId).toBe("fast")
      expect(slow.stopped).toBe(1)
      expect([dispatcher.inFlight("slow"), dispatcher.inFlight("fast")]).toEqual([0, 0])
    }),
  )

  it.live(
    "the embedded simulator's nodes are begun by callback: the run by plain calls, the node released",
    () =>
      Effect.gen(function* () {
        const sims = makeProfiles({ seed: 3, count: 4, dishonest: 0 }).map((profile) =>
          makeSimNode(
            { ...profile, failure: { refuse: 0, failBeforeFirstToken: 0, breakMidStream: 0, stall: 0 } },
            { speed: 1000, seed: 3 },
          ),
        )
        const dispatcher = Dispatcher.make(
          presets,
          sims.map((sim) => SimTransport.fromSimNode(sim, [prime])),
        )
        for (let i = 0; i < 5; i++) {
          const result = yield* begin(dispatcher)
          expect(result.plain).toBe(true)
          expect(result.events.at(-1)?._tag).toBe("Finish")
          expect(result.events.filter((e) => e._tag === "Delta").length).toBeGreaterThan(0)
        }
        const stats = yield* Effect.forEach(sims, (sim) => sim.stats)
        expect(stats.reduce((n, s) => n + s.started, 0)).toBe(5)
        expect(stats.every((s) => s.active === 0)).toBe(true)
        expect(sims.map((sim) => dispatcher.inFlight(sim.profile.id))).toEqual([0, 0, 0, 0])
      }),
  )

  it.live("no node free and no queue: handed over, 429 capacity_exhausted", () =>
    Effect.gen(function* () {
      const node = callbackNode("only", () => ({ ttft: 5 }), 0)
      const result = yield* begin(Dispatcher.make(presets, [node]))
      expect(result.plain).toBe(false)
      expect(result.failure).toBeInstanceOf(CapacityExhausted)
    }),
  )
})
