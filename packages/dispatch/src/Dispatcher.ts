/**
 * Runs a request on the swarm. Membership (static nodes, registered nodes
 * with expiry, draining), per-node health with a circuit breaker, and the two
 * strategies:
 *
 * - `single`: power-of-two-choices on in-flight/capacity and recent latency;
 *   a node failing before its first token is replaced invisibly; when the
 *   first token is later than the node's recent p95, a second node is started
 *   and whichever produces a token first wins, the other is cancelled.
 * - `consensus`: k nodes answer, judges compare the answers pairwise, the
 *   Bradley–Terry winner (votes weighted by judge reputation) is returned.
 *
 * Every slot on a node is held in the caller's scope and released exactly once.
 */
import { CapacityExhausted, Tokens, UpstreamError } from "@swarmgate/protocol"
import {
  Cause,
  Chunk,
  Clock,
  Context,
  Deferred,
  Effect,
  Either,
  ExecutionStrategy,
  Exit,
  Fiber,
  Layer,
  Option,
  Queue,
  Random,
  Schedule,
  Scope,
  Stream,
} from "effect"
import * as Consensus from "./Consensus"
import * as HttpTransport from "./HttpTransport"
import {
  defaultHealthOptions,
  type HealthOptions,
  type HealthSnapshot,
  NodeHealth,
  percentile,
} from "./NodeHealth"
import type { NodeSpec } from "./NodesFile"
import { type NodeEvent, NodeFailure, type NodePull, type NodeRequest, type SwarmNode } from "./NodeTransport"
import type { Preset } from "./Presets"

export interface DispatcherOptions {
  /** Nodes tried for one request when they fail before the first token (default 3). */
  readonly maxAttempts?: number | undefined
  /** How long a request waits for a free node before 429 `capacity_exhausted` (default 0: no wait). */
  readonly queueWaitMillis?: number | undefined
  /** Requests that may wait at once; more are refused at once (default 256). */
  readonly queueMax?: number | undefined
  /** Hedge threshold for a node without enough history, when the swarm has none either (default 1000; 0: no hedging). */
  readonly hedgeAfterMillis?: number | undefined
  /** Never hedge sooner than this (default 20). */
  readonly hedgeMinMillis?: number | undefined
  /** A node that has not produced a first token by then has failed (default 30 s). */
  readonly firstTokenTimeoutMillis?: number | undefined
  /** A running stream silent this long has failed: `stalled` (default 30 s). */
  readonly idleTimeoutMillis?: number | undefined
  /** Health probes and membership sweeps (default 5 s). */
  readonly probeIntervalMillis?: number | undefined
  /** A registered node that sends no heartbeat for this long is drained (default 30 s). */
  readonly registrationTtlMillis?: number | undefined
  /** One judge's verdict must come within this (default 20 s). */
  readonly judgeTimeoutMillis?: number | undefined
  readonly health?: Partial<HealthOptions> | undefined
  /** Builds registered nodes (default: OpenAI-compatible HTTP). */
  readonly makeNode?: ((spec: NodeSpec) => SwarmNode) | undefined
  /** Sees every consensus decision (experiments, logs). */
  readonly onConsensus?: ((trace: ConsensusTrace) => void) | undefined
}

export interface NodeRun {
  /** The node answering; for consensus `consensus:<authors>`. */
  readonly nodeId: string
  /**
   * The answer's events, a chunk per pull; starts with the first event
   * already received (failures before it were retried). Read either `pull`
   * or `events`, not both: they are one sequence.
   */
  readonly pull: NodePull
  /** `pull` as a stream. */
  readonly events: Stream.Stream<NodeEvent, NodeFailure>
}

const runOf = (nodeId: string, pull: NodePull): NodeRun => ({
  nodeId,
  pull,
  events: Stream.repeatEffectChunkOption(pull),
})

const ended: NodePull = Effect.fail(Option.none())

/** Pulls until a chunk holds an event: streams may emit empty chunks. */
const firstNonEmpty = (pull: NodePull): NodePull =>
  Effect.flatMap(pull, (chunk) => (Chunk.isNonEmpty(chunk) ? Effect.succeed(chunk) : firstNonEmpty(pull)))

/** The node's answer as a pull held by the current scope. */
const openOn = (node: SwarmNode, request: NodeRequest): Effect.Effect<NodePull, never, Scope.Scope> =>
  node.open !== undefined ? node.open(request) : Stream.toPull(node.generate(request))

/** A node as the admin API shows it: its membership, load and health. */
export interface NodeStatus extends HealthSnapshot {
  readonly id: string
  readonly url: string | undefined
  readonly source: "static" | "registered"
  readonly state: "active" | "draining"
  // Restated so that views built on it need not name NodeHealth's type.
  readonly circuit: "closed" | "open" | "half_open"
  readonly models: Readonly<Record<string, string>>
  readonly capacity: number
  readonly inFlight: number
  readonly vision: boolean
  readonly hedges: number
  readonly expiresAt: number | undefined
}

export interface ConsensusTrace {
  readonly requestId: string
  readonly presetId: string
  readonly question: string
  readonly answers: ReadonlyArray<{ readonly nodeId: string; readonly text: string }>
  /** Distinct answer texts, with who sent each and its Bradley–Terry strength. */
  readonly candidates: ReadonlyArray<{
    readonly text: string
    readonly authors: ReadonlyArray<string>
    readonly strength: number
  }>
  readonly votes: ReadonlyArray<Consensus.Vote>
  readonly winner: number
  /** Judges' reputations before this decision updated them. */
  readonly reputations: Readonly<Record<string, number>>
}

export type RegisterResult = Either.Either<{ readonly created: boolean; readonly node: NodeStatus }, string>

export interface DispatcherShape {
  readonly presets: ReadonlyArray<Preset>
  readonly preset: (id: string) => Preset | undefined
  /** Active (not draining) nodes serving the preset. */
  readonly nodesFor: (presetId: string) => ReadonlyArray<SwarmNode>
  readonly inFlight: (nodeId: string) => number
  /**
   * Runs the request by the preset's strategy. Fails before generation with
   * 429 `capacity_exhausted` (no free node within the queue wait) or 502
   * `upstream_error` (every attempt failed before its first token).
   */
  readonly run: (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ) => Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope>
  readonly status: Effect.Effect<ReadonlyArray<NodeStatus>>
  /** Adds a node or renews its registration (heartbeat); nodes of the nodes file cannot be replaced. */
  readonly register: (spec: NodeSpec, ttlMillis?: number) => Effect.Effect<RegisterResult>
  /** Stops sending new requests to the node and removes it once idle; undefined if unknown. */
  readonly drain: (nodeId: string) => Effect.Effect<NodeStatus | undefined>
  /** One round of membership sweeps and health probes (the layer runs it every `probeIntervalMillis`). */
  readonly maintain: Effect.Effect<void>
}

export class Dispatcher extends Context.Tag("@swarmgate/dispatch/Dispatcher")<
  Dispatcher,
  DispatcherShape
>() {}

interface Entry {
  node: SwarmNode
  readonly health: NodeHealth
  inFlight: number
  state: "active" | "draining"
  readonly source: "static" | "registered"
  expiresAt: number | undefined
  spec: NodeSpec | undefined
  hedges: number
}

interface Slot {
  readonly entry: Entry
  readonly trial: number | undefined
}

interface Attempt {
  readonly slot: Slot
  readonly scope: Scope.CloseableScope
  readonly pull: NodePull
  readonly startedAt: number
}

type Next =
  | {
      readonly _tag: "Done"
      readonly attempt: Attempt
      readonly exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>
    }
  | { readonly _tag: "Hedge" }

interface Answer {
  readonly nodeId: string
  readonly events: ReadonlyArray<NodeEvent>
  readonly text: string
}

/** Latency added to every node's so that load still matters between very fast nodes. */
const LATENCY_FLOOR_MILLIS = 50

const textOf = (events: ReadonlyArray<NodeEvent>) =>
  events.map((event) => (event._tag === "Delta" ? event.text : "")).join("")

export const make = (
  presets: ReadonlyArray<Preset>,
  nodes: ReadonlyArray<SwarmNode>,
  options: DispatcherOptions = {},
): DispatcherShape => {
  const maxAttempts = Math.max(1, options.maxAttempts ?? 3)
  const queueWaitMillis = Math.max(0, options.queueWaitMillis ?? 0)
  const queueMax = options.queueMax ?? 256
  const hedgeAfterMillis = options.hedgeAfterMillis ?? 1_000
  const hedgeMinMillis = options.hedgeMinMillis ?? 20
  const firstTokenTimeoutMillis = options.firstTokenTimeoutMillis ?? 30_000
  const idleTimeoutMillis = options.idleTimeoutMillis ?? 30_000
  const probeIntervalMillis = options.probeIntervalMillis ?? 5_000
  const registrationTtlMillis = options.registrationTtlMillis ?? 30_000
  const judgeTimeoutMillis = options.judgeTimeoutMillis ?? 20_000
  const healthOptions: HealthOptions = { ...defaultHealthOptions, ...options.health }
  const makeNode = options.makeNode ?? ((spec: NodeSpec) => HttpTransport.fromSpec(spec))
  const presetById = new Map(presets.map((p) => [p.id, p]))

  // --- membership --------------------------------------------------------------------------

  const entries = new Map<string, Entry>()
  for (const node of nodes) {
    entries.set(node.id, {
      node,
      health: new NodeHealth(healthOptions),
      inFlight: 0,
      state: "active",
      source: "static",
      expiresAt: undefined,
      spec: undefined,
      hedges: 0,
    })
  }
  // Serving entries per preset, rebuilt when membership changes (not per request).
  let servingCache: Map<string, Array<Entry>> | undefined
  const serving = (presetId: string): ReadonlyArray<Entry> => {
    if (servingCache === undefined) {
      servingCache = new Map(presets.map((p) => [p.id, [] as Array<Entry>]))
      for (const entry of entries.values())
        if (entry.state === "active")
          for (const presetId of entry.node.models.keys()) servingCache.get(presetId)?.push(entry)
    }
    return servingCache.get(presetId) ?? []
  }
  const changed = () => {
    servingCache = undefined
  }
  const removeIfIdle = (entry: Entry) => {
    if (entry.state === "draining" && entry.inFlight === 0 && entries.get(entry.node.id) === entry) {
      entries.delete(entry.node.id)
      changed()
    }
  }

  // --- slots and the dispatch queue ----------------------------------------------------------

  const waiters = new Set<Deferred.Deferred<void>>()
  const wakeWaiters = () => {
    if (waiters.size === 0) return
    const woken = [...waiters]
    waiters.clear()
    for (const waiter of woken) Deferred.unsafeDone(waiter, Exit.void)
  }

  const latencyOf = (entry: Entry) => (entry.health.ttftMillis ?? 0) + LATENCY_FLOOR_MILLIS
  const cost = (entry: Entry) => ((entry.inFlight + 1) / entry.node.capacity) * latencyOf(entry)

  const free = (entry: Entry, now: number) =>
    entry.state === "active" && entry.inFlight < entry.node.capacity && entry.health.admits(now)

  /** Takes a slot on the cheaper of two random free candidates, in one synchronous step. */
  const claimNow = (
    candidates: ReadonlyArray<Entry>,
    exclude: ReadonlySet<string>,
    vision: boolean,
    r1: number,
    r2: number,
    now: number,
  ): Slot | undefined => {
    const open = candidates.filter(
      (e) => !exclude.has(e.node.id) && (!vision || e.node.vision) && free(e, now),
    )
    if (open.length === 0) return undefined
    let entry = open[0]!
    if (open.length > 1) {
      const a = Math.floor(r1 * open.length)
      let b = Math.floor(r2 * (open.length - 1))
      if (b >= a) b++
      const first = open[a]!
      const second = open[b]!
      entry = cost(first) <= cost(second) ? first : second
    }
    entry.inFlight++
    return { entry, trial: entry.health.start(now) }
  }

  const release = (slot: Slot) =>
    Effect.sync(() => {
      slot.entry.inFlight--
      slot.entry.health.abandon(slot.trial)
      removeIfIdle(slot.entry)
      wakeWaiters()
    })

  /** One try at a slot, released with the current scope. */
  const tryClaim = (candidates: () => ReadonlyArray<Entry>, exclude: ReadonlySet<string>, vision: boolean) =>
    Effect.acquireRelease(
      Effect.flatMap(Effect.all([Random.next, Random.next, Clock.currentTimeMillis]), ([r1, r2, now]) =>
        Effect.sync(() => claimNow(candidates(), exclude, vision, r1, r2, now)),
      ),
      (slot) => (slot === undefined ? Effect.void : release(slot)),
    )

  /** Takes a slot on one given node if it is free now. */
  const claimOn = (entry: Entry) =>
    Effect.acquireRelease(
      Effect.map(Clock.currentTimeMillis, (now): Slot | undefined => {
        if (!free(entry, now)) return undefined
        entry.inFlight++
        return { entry, trial: entry.health.start(now) }
      }),
      (slot) => (slot === undefined ? Effect.void : release(slot)),
    )

  /**
   * A slot on a node of `candidates`, waiting up to `waitMillis` in the
   * bounded queue while every eligible node is busy. Undefined when no node
   * came free, the queue is full, or no untried node could serve at all.
   */
  const acquire = (
    candidates: () => ReadonlyArray<Entry>,
    exclude: ReadonlySet<string>,
    vision: boolean,
    waitMillis: number,
  ): Effect.Effect<Slot | undefined, never, Scope.Scope> =>
    Effect.gen(function* () {
      const deadline = (yield* Clock.currentTimeMillis) + waitMillis
      while (true) {
        const waiter = yield* Deferred.make<void>()
        // Registered before trying, so a release between the try and the wait still wakes us.
        waiters.add(waiter)
        const slot = yield* tryClaim(candidates, exclude, vision)
        if (slot !== undefined) {
          waiters.delete(waiter)
          return slot
        }
        const remaining = deadline - (yield* Clock.currentTimeMillis)
        const possible = candidates().some((e) => !exclude.has(e.node.id) && (!vision || e.node.vision))
        if (remaining <= 0 || !possible || waiters.size > queueMax) {
          waiters.delete(waiter)
          return undefined
        }
        yield* Deferred.await(waiter).pipe(
          Effect.timeout(remaining),
          Effect.ignore,
          Effect.ensuring(Effect.sync(() => waiters.delete(waiter))),
        )
      }
    })

  const capacityExhausted = (preset: Preset) =>
    new CapacityExhausted({
      message: `No capacity for ${preset.id} right now; retry after the indicated delay.`,
      retryAfterSeconds: Math.min(60, Math.max(1, Math.ceil(queueWaitMillis / 1000))),
    })

  const modelRequest = (entry: Entry, preset: Preset, request: Omit<NodeRequest, "model">): NodeRequest => ({
    ...request,
    model: entry.node.models.get(preset.id) ?? preset.id,
    idleTimeoutMillis,
  })

  const timedOut = (entry: Entry, what: string, millis: number) =>
    new NodeFailure({ nodeId: entry.node.id, reason: `timeout: ${what} after ${millis} ms` })

  /** The idle limit for nodes that do not enforce it themselves: a timer per pull. */
  const idleLimit = (entry: Entry) =>
    within(entry.node.enforcesIdleTimeout === true ? 0 : idleTimeoutMillis, () =>
      Option.some(new NodeFailure({ nodeId: entry.node.id, reason: "stalled" })),
    )

  const recordFailure = (slot: Slot, failure: NodeFailure) =>
    Effect.map(Clock.currentTimeMillis, (now) => slot.entry.health.failure(now, failure.reason, slot.trial))

  /**
   * The winning stream: its first chunk, then the rest pulled as it comes.
   * Failures count against the node; when the attempt's scope closes without
   * one (the end, or the reader stopping early at the token cap) the speed
   * seen so far is recorded. One pull per chunk, no stream stages per event.
   */
  const instrument = (attempt: Attempt, firstAt: number, first: Chunk.Chunk<NodeEvent>) =>
    Effect.gen(function* () {
      const { slot } = attempt
      let text = ""
      let failed = false
      const see = (chunk: Chunk.Chunk<NodeEvent>) => {
        for (const event of chunk) if (event._tag === "Delta") text += event.text
      }
      see(first)
      yield* Scope.addFinalizer(
        attempt.scope,
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.sync(() => {
            if (!failed) slot.entry.health.succeeded(text.length > 0 ? Tokens.count(text) : 0, now - firstAt)
          }),
        ),
      )
      let pending: Chunk.Chunk<NodeEvent> | undefined = first
      const pull: NodePull = Effect.suspend(() => {
        if (pending !== undefined) {
          const chunk = pending
          pending = undefined
          return Effect.succeed(chunk)
        }
        return attempt.pull.pipe(
          idleLimit(slot.entry),
          Effect.tap(see),
          Effect.tapError((error) =>
            Option.isNone(error)
              ? Effect.void
              : Effect.flatMap(Clock.currentTimeMillis, (now) =>
                  Effect.sync(() => {
                    failed = true
                    slot.entry.health.failure(now, error.value.reason, slot.trial)
                  }),
                ),
          ),
        )
      })
      return pull
    })

  // --- strategy single -----------------------------------------------------------------------

  /** When to start a second node: the node's own p95, else the preset's, else the configured default. */
  const hedgeDelay = (preset: Preset, entry: Entry): number | undefined => {
    if (hedgeAfterMillis <= 0) return undefined
    const own = entry.health.p95()
    if (own !== undefined) return Math.max(hedgeMinMillis, own)
    const pooled = serving(preset.id).flatMap((e) => e.health.recentTtfts())
    const swarm = pooled.length >= 32 ? percentile(pooled, 0.95) : undefined
    return Math.max(hedgeMinMillis, swarm ?? hedgeAfterMillis)
  }

  const single = (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope> =>
    Effect.gen(function* () {
      const parent = yield* Effect.scope
      // Images go only to nodes that can see them.
      const vision = request.messages.some((m) => m.images.length > 0)
      const candidates = () => serving(preset.id)
      const tried = new Set<string>()
      // Attempts report their first event (or failure) here, and so does the hedge timer.
      const reports = yield* Queue.unbounded<Next>()

      const launch = (waitMillis: number): Effect.Effect<Attempt | undefined> =>
        Effect.gen(function* () {
          // The slot and the node stream live in a child scope so a lost or failed attempt frees its node at once.
          const child = yield* Scope.fork(parent, ExecutionStrategy.sequential)
          const slot = yield* Scope.extend(acquire(candidates, tried, vision, waitMillis), child)
          if (slot === undefined) {
            yield* Scope.close(child, Exit.void)
            return undefined
          }
          tried.add(slot.entry.node.id)
          const startedAt = yield* Clock.currentTimeMillis
          const pull = yield* Scope.extend(
            openOn(slot.entry.node, modelRequest(slot.entry, preset, request)),
            child,
          )
          const firstPull = firstNonEmpty(pull).pipe(
            within(firstTokenTimeoutMillis, () =>
              Option.some(timedOut(slot.entry, "no first token", firstTokenTimeoutMillis)),
            ),
          )
          const attempt: Attempt = { slot, scope: child, pull, startedAt }
          yield* Effect.forkIn(
            Effect.flatMap(Effect.exit(firstPull), (exit) =>
              Queue.offer(reports, { _tag: "Done", attempt, exit }),
            ),
            child,
          )
          return attempt
        })

      const first = yield* launch(queueWaitMillis)
      if (first === undefined) return yield* Effect.fail(capacityExhausted(preset))
      let running: Array<Attempt> = [first]
      let launched = 1
      // At most one hedge per request, timed from the start of the attempt it backs up.
      let hedged = false
      let timer: Fiber.RuntimeFiber<boolean> | undefined
      const stopTimer = Effect.suspend(() => (timer === undefined ? Effect.void : Fiber.interrupt(timer)))
      const armHedge = (attempt: Attempt) =>
        Effect.gen(function* () {
          yield* stopTimer
          const delay = hedged ? undefined : hedgeDelay(preset, attempt.slot.entry)
          timer =
            delay === undefined
              ? undefined
              : yield* Effect.forkIn(
                  Effect.zipRight(Effect.sleep(delay), Queue.offer(reports, { _tag: "Hedge" })),
                  parent,
                )
        })
      yield* armHedge(first)

      while (true) {
        const next = yield* Queue.take(reports)
        // A report from an attempt already given up on.
        if (next._tag === "Done" && !running.includes(next.attempt)) continue

        if (next._tag === "Hedge") {
          hedged = true
          // Only a node free right now: a hedge never waits in the queue.
          const hedge = yield* launch(0)
          if (hedge !== undefined) {
            for (const attempt of running) attempt.slot.entry.hedges++
            running = [...running, hedge]
          }
          continue
        }

        const { attempt } = next
        const outcome = classify(attempt.slot.entry.node.id, next.exit)
        running = running.filter((a) => a !== attempt)
        const at = yield* Clock.currentTimeMillis
        if (outcome._tag !== "Failed") {
          yield* stopTimer
          // The winner: the others are cancelled, their slots freed, their lateness noted.
          for (const loser of running) {
            loser.slot.entry.health.slow(at - loser.startedAt)
            yield* Scope.close(loser.scope, Exit.void)
          }
          attempt.slot.entry.health.firstToken(at - attempt.startedAt, attempt.slot.trial)
          if (outcome._tag === "Empty") {
            // The node ended its stream without any event: an empty answer.
            attempt.slot.entry.health.succeeded()
            return runOf(attempt.slot.entry.node.id, ended)
          }
          return runOf(attempt.slot.entry.node.id, yield* instrument(attempt, at, outcome.chunk))
        }

        yield* recordFailure(attempt.slot, outcome.failure)
        yield* Scope.close(attempt.scope, Exit.void)
        if (running.length > 0) continue
        if (launched < maxAttempts) {
          launched++
          const replacement = yield* launch(queueWaitMillis)
          if (replacement !== undefined) {
            running = [replacement]
            yield* armHedge(replacement)
            continue
          }
        }
        yield* stopTimer
        return yield* Effect.fail(
          new UpstreamError({ message: "The request failed before generation on every node tried." }),
        )
      }
    })

  // --- strategy consensus --------------------------------------------------------------------

  /** Runs a request on a held slot to its end, with the first-token and idle limits; feeds the node's health. */
  const complete = (
    slot: Slot,
    request: NodeRequest,
    limitMillis?: number,
  ): Effect.Effect<Answer, NodeFailure> => {
    const { entry } = slot
    let firstAt: number | undefined
    let startedAt = 0
    const run = Effect.scoped(
      Effect.gen(function* () {
        startedAt = yield* Clock.currentTimeMillis
        const pull = yield* openOn(entry.node, request)
        const events: Array<NodeEvent> = []
        const first = yield* firstNonEmpty(pull).pipe(
          within(firstTokenTimeoutMillis, () =>
            Option.some(timedOut(entry, "no first token", firstTokenTimeoutMillis)),
          ),
          endOfStream,
        )
        if (Option.isNone(first)) return events
        firstAt = yield* Clock.currentTimeMillis
        entry.health.firstToken(firstAt - startedAt, slot.trial)
        // Held whole until judged, so bounded: a node ignoring max_tokens is cut just past the cap.
        let tokens = 0
        const add = (chunk: Chunk.Chunk<NodeEvent>): boolean => {
          for (const event of chunk) {
            events.push(event)
            if (event._tag !== "Delta") continue
            tokens += Tokens.count(event.text, request.maxTokens - tokens + 1)
            if (tokens > request.maxTokens) {
              events.push({ _tag: "Finish", reason: "length" })
              return false
            }
          }
          return true
        }
        if (!add(first.value)) return events
        while (true) {
          const next = yield* pull.pipe(idleLimit(entry), endOfStream)
          if (Option.isNone(next) || !add(next.value)) return events
        }
      }),
    )
    return Effect.gen(function* () {
      const result = yield* Effect.either(
        within(limitMillis ?? 0, () => timedOut(entry, "no complete answer", limitMillis ?? 0))(run),
      )
      const now = yield* Clock.currentTimeMillis
      if (Either.isLeft(result)) {
        entry.health.failure(now, result.left.reason, slot.trial)
        return yield* Effect.fail(result.left)
      }
      if (firstAt === undefined) entry.health.firstToken(now - startedAt, slot.trial)
      const text = textOf(result.right)
      entry.health.succeeded(Tokens.count(text), now - (firstAt ?? startedAt))
      return { nodeId: entry.node.id, events: result.right, text }
    })
  }

  const consensus = (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope> =>
    Effect.gen(function* () {
      const params = preset.consensus
      const parent = yield* Effect.scope
      const vision = request.messages.some((m) => m.images.length > 0)
      const candidates = () => serving(preset.id)
      const tried = new Set<string>()
      const answers: Array<Answer> = []
      const quorum = yield* Deferred.make<void>()
      const startedAt = yield* Clock.currentTimeMillis

      // An author answers on its node; one failing is replaced by an untried node while attempts last.
      const author = (slot: Slot, scope: Scope.CloseableScope): Effect.Effect<void> =>
        Effect.gen(function* () {
          let current: { slot: Slot; scope: Scope.CloseableScope } | undefined = { slot, scope }
          for (let attempt = 1; current !== undefined; attempt++) {
            const result = yield* Effect.either(
              complete(current.slot, modelRequest(current.slot.entry, preset, request)),
            ).pipe(Effect.ensuring(Scope.close(current.scope, Exit.void)))
            if (Either.isRight(result)) {
              answers.push(result.right)
              if (answers.length >= Math.min(params.quorum, params.k))
                yield* Deferred.succeed(quorum, undefined)
              return
            }
            current = undefined
            if (attempt >= maxAttempts) return
            const child = yield* Scope.fork(parent, ExecutionStrategy.sequential)
            const next = yield* Scope.extend(acquire(candidates, tried, vision, 0), child)
            if (next === undefined) yield* Scope.close(child, Exit.void)
            else {
              tried.add(next.entry.node.id)
              current = { slot: next, scope: child }
            }
          }
        })

      // The first author may wait in the queue; the others take what is free now.
      const slots: Array<{ slot: Slot; scope: Scope.CloseableScope }> = []
      for (let i = 0; i < params.k; i++) {
        const child = yield* Scope.fork(parent, ExecutionStrategy.sequential)
        const slot = yield* Scope.extend(
          acquire(candidates, tried, vision, i === 0 ? queueWaitMillis : 0),
          child,
        )
        if (slot === undefined) {
          yield* Scope.close(child, Exit.void)
          break
        }
        tried.add(slot.entry.node.id)
        slots.push({ slot, scope: child })
      }
      if (slots.length === 0) return yield* Effect.fail(capacityExhausted(preset))

      const all = Effect.forEach(slots, ({ scope, slot }) => author(slot, scope), {
        concurrency: "unbounded",
        discard: true,
      })
      // Past the deadline, a quorum is enough: the stragglers are cancelled.
      const deadline = Effect.zipRight(
        Effect.sleep(Math.max(0, startedAt + params.deadlineMillis - (yield* Clock.currentTimeMillis))),
        Deferred.await(quorum),
      )
      yield* Effect.race(all, deadline)
      if (answers.length === 0) {
        return yield* Effect.fail(
          new UpstreamError({ message: "The request failed before generation on every node tried." }),
        )
      }
      const collected = [...answers]
      const authors = collected.map((a) => a.nodeId)
      // Ranked on the first pull, with the judges' slots held only while they judge.
      let ranked = false
      const pull: NodePull = Effect.suspend(() => {
        if (ranked) return ended
        ranked = true
        return Effect.map(Effect.scoped(rank(preset, request, collected)), (winner) =>
          Chunk.unsafeFromArray([...winner.events]),
        )
      })
      return runOf(`consensus:${authors.join(",")}`, pull)
    })

  /** Judges compare the distinct answers pairwise; the Bradley–Terry winner is returned. */
  const rank = (preset: Preset, request: Omit<NodeRequest, "model">, answers: ReadonlyArray<Answer>) =>
    Effect.gen(function* () {
      const candidates: Array<{ text: string; events: ReadonlyArray<NodeEvent>; authors: Array<string> }> = []
      for (const answer of answers) {
        const same = candidates.find((c) => c.text === answer.text)
        if (same !== undefined) same.authors.push(answer.nodeId)
        else candidates.push({ text: answer.text, events: answer.events, authors: [answer.nodeId] })
      }
      const lastUser =
        [...request.messages].reverse().find((m) => m.role === "user") ?? request.messages.at(-1)
      const question = lastUser?.content ?? ""
      const reputations: Record<string, number> = {}
      const votes: Array<Consensus.Vote> = []
      let strengths = candidates.map(() => 1)

      if (candidates.length > 1) {
        const authorIds = new Set(answers.map((a) => a.nodeId))
        // Judges are picked from nodes without an answer in the running where possible.
        const pool = yield* Effect.map(Clock.currentTimeMillis, (now) =>
          serving(preset.id).filter((e) => free(e, now)),
        )
        const outsiders = pool.filter((e) => !authorIds.has(e.node.id))
        const insiders = pool.filter((e) => authorIds.has(e.node.id))
        const shuffled = [...(yield* Random.shuffle(outsiders)), ...(yield* Random.shuffle(insiders))]
        const judges: Array<Slot> = []
        for (const entry of shuffled) {
          if (judges.length >= preset.consensus.judges) break
          const slot = yield* claimOn(entry)
          if (slot !== undefined) judges.push(slot)
        }
        for (const judge of judges) reputations[judge.entry.node.id] = judge.entry.health.reputation
        const pairs: Array<readonly [number, number]> = []
        for (let i = 0; i < candidates.length; i++)
          for (let j = i + 1; j < candidates.length; j++) pairs.push([i, j])

        yield* Effect.forEach(
          judges,
          (judge, n) =>
            Effect.gen(function* () {
              for (const [i, j] of yield* Random.shuffle(pairs)) {
                // Either order, at random: a judge with a position bias gains nothing from it.
                const swap = yield* Random.nextBoolean
                const [a, b] = swap ? [j, i] : [i, j]
                const verdict = yield* Effect.either(
                  complete(
                    judge,
                    {
                      requestId: `${request.requestId}-judge-${n}`,
                      model: judge.entry.node.models.get(preset.id) ?? preset.id,
                      messages: Consensus.judgeMessages(question, candidates[a]!.text, candidates[b]!.text),
                      maxTokens: 8,
                      jsonMode: false,
                      sampling: { temperature: 0 },
                    },
                    judgeTimeoutMillis,
                  ),
                )
                if (Either.isLeft(verdict)) return
                const choice = Consensus.parseVerdict(verdict.right.text)
                if (choice === undefined) continue
                votes.push({
                  judge: judge.entry.node.id,
                  winner: choice === "A" ? a : b,
                  loser: choice === "A" ? b : a,
                  weight: Consensus.weightOf(judge.entry.health.reputation),
                })
              }
            }),
          { concurrency: "unbounded", discard: true },
        )
        strengths = Consensus.bradleyTerry(candidates.length, votes)
        for (const [judge, { agreed, total }] of Consensus.agreement(candidates.length, votes)) {
          const entry = entries.get(judge)
          if (entry !== undefined)
            entry.health.reputation = Consensus.updateReputation(entry.health.reputation, agreed, total)
        }
      }

      // Without votes, trust the authors' standing.
      const standing = (c: (typeof candidates)[number]) =>
        Math.max(...c.authors.map((id) => entries.get(id)?.health.reputation ?? 0))
      const scores =
        votes.length > 0
          ? strengths.map((s, i) => s + standing(candidates[i]!) * 1e-6)
          : candidates.map(standing)
      const winner = Consensus.argmax(scores)
      options.onConsensus?.({
        requestId: request.requestId,
        presetId: preset.id,
        question,
        answers: answers.map((a) => ({ nodeId: a.nodeId, text: a.text })),
        candidates: candidates.map((c, i) => ({ text: c.text, authors: c.authors, strength: strengths[i]! })),
        votes,
        winner,
        reputations,
      })
      return candidates[winner]!
    })

  // --- membership operations and maintenance -----------------------------------------------

  const statusOf = (entry: Entry, now: number): NodeStatus => ({
    ...entry.health.snapshot(now),
    id: entry.node.id,
    url: entry.node.url,
    source: entry.source,
    state: entry.state,
    models: Object.fromEntries(entry.node.models),
    capacity: entry.node.capacity,
    inFlight: entry.inFlight,
    vision: entry.node.vision,
    hedges: entry.hedges,
    expiresAt: entry.expiresAt,
  })

  const sameSpec = (a: NodeSpec | undefined, b: NodeSpec) =>
    a !== undefined && JSON.stringify(a) === JSON.stringify(b)

  const register = (spec: NodeSpec, ttlMillis?: number): Effect.Effect<RegisterResult> =>
    Effect.map(Clock.currentTimeMillis, (now): RegisterResult => {
      const existing = entries.get(spec.id)
      const expiresAt = now + (ttlMillis ?? registrationTtlMillis)
      if (existing !== undefined && existing.source === "static") {
        return Either.left(`node ${spec.id} comes from the nodes file and cannot be registered`)
      }
      if (existing !== undefined) {
        existing.expiresAt = expiresAt
        if (!sameSpec(existing.spec, spec)) {
          existing.node = makeNode(spec)
          existing.spec = spec
          changed()
        }
        return Either.right({ created: false, node: statusOf(existing, now) })
      }
      const entry: Entry = {
        node: makeNode(spec),
        health: new NodeHealth(healthOptions),
        inFlight: 0,
        state: "active",
        source: "registered",
        expiresAt,
        spec,
        hedges: 0,
      }
      entries.set(spec.id, entry)
      changed()
      wakeWaiters()
      return Either.right({ created: true, node: statusOf(entry, now) })
    })

  const drain = (nodeId: string) =>
    Effect.map(Clock.currentTimeMillis, (now) => {
      const entry = entries.get(nodeId)
      if (entry === undefined) return undefined
      entry.state = "draining"
      changed()
      const status = statusOf(entry, now)
      removeIfIdle(entry)
      return status
    })

  const probe = (entry: Entry, now: number) => {
    const check = entry.node.probe
    if (check === undefined) return Effect.void
    const trial = entry.health.start(now)
    return Effect.flatMap(Effect.either(check), (result) =>
      Effect.flatMap(Clock.currentTimeMillis, (at) =>
        Effect.sync(() => {
          if (Either.isRight(result)) entry.health.probeSucceeded(trial)
          else entry.health.failure(at, `probe: ${result.left.reason}`, trial)
          wakeWaiters()
        }),
      ),
    )
  }

  const maintain = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const due: Array<Effect.Effect<void>> = []
    for (const entry of [...entries.values()]) {
      if (entry.source === "registered" && entry.state === "active" && (entry.expiresAt ?? now) < now) {
        entry.state = "draining"
        changed()
      }
      removeIfIdle(entry)
      if (entry.state !== "active") continue
      const admits = entry.health.admits(now)
      const idle = now - entry.health.lastActivity >= probeIntervalMillis
      // Open circuits past their cool-down get their trial; quiet nodes get checked before traffic finds them dead.
      if (
        (entry.health.circuit === "half_open" && admits) ||
        (entry.health.circuit === "closed" && idle && entry.inFlight === 0)
      )
        due.push(probe(entry, now))
    }
    yield* Effect.all(due, { concurrency: "unbounded", discard: true })
  })

  return {
    presets,
    preset: (id) => presetById.get(id),
    nodesFor: (presetId) => serving(presetId).map((e) => e.node),
    inFlight: (nodeId) => entries.get(nodeId)?.inFlight ?? 0,
    run: (preset, request) =>
      preset.strategy === "consensus" ? consensus(preset, request) : single(preset, request),
    status: Effect.map(Clock.currentTimeMillis, (now) => [...entries.values()].map((e) => statusOf(e, now))),
    register,
    drain,
    maintain,
  }
}

/** A pull's end of stream (`None` failure) as a `None` value; its failures as plain failures. */
const endOfStream = <A, E, R>(
  pull: Effect.Effect<A, Option.Option<E>, R>,
): Effect.Effect<Option.Option<A>, E, R> =>
  Effect.catchAll(Effect.map(pull, Option.some), (error) =>
    Option.isNone(error) ? Effect.succeed(Option.none()) : Effect.fail(error.value),
  )

/** Runs `effect` with a time limit (0: none). */
const within =
  <E>(millis: number, onTimeout: () => E) =>
  <A, E2, R>(effect: Effect.Effect<A, E2, R>): Effect.Effect<A, E | E2, R> =>
    millis > 0 ? Effect.timeoutFail(effect, { duration: millis, onTimeout }) : effect

type FirstOutcome =
  | { readonly _tag: "First"; readonly chunk: Chunk.Chunk<NodeEvent> }
  | { readonly _tag: "Empty" }
  | { readonly _tag: "Failed"; readonly failure: NodeFailure }

/** How waiting for a node's first event ended: an event, the end of its stream, or a failure (defects included). */
const classify = (
  nodeId: string,
  exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>,
): FirstOutcome => {
  if (Exit.isSuccess(exit)) return { _tag: "First", chunk: exit.value }
  const failure = Cause.failureOption(exit.cause)
  if (Option.isSome(failure)) {
    return Option.isNone(failure.value) ? { _tag: "Empty" } : { _tag: "Failed", failure: failure.value.value }
  }
  return {
    _tag: "Failed",
    failure: new NodeFailure({ nodeId, reason: `defect: ${Cause.pretty(exit.cause).slice(0, 200)}` }),
  }
}

/**
 * The dispatcher as a service, with its maintenance (health probes,
 * registration expiry, drained nodes) running every `probeIntervalMillis`
 * for as long as the layer lives.
 */
export const layer = (
  presets: ReadonlyArray<Preset>,
  nodes: ReadonlyArray<SwarmNode>,
  options?: DispatcherOptions,
) =>
  Layer.scoped(
    Dispatcher,
    Effect.gen(function* () {
      const dispatcher = make(presets, nodes, options)
      // A failed round must not end the loop: probes and expiry would silently stop.
      const round = Effect.catchAllCause(dispatcher.maintain, (cause) =>
        Effect.logWarning("dispatcher maintenance failed", cause),
      )
      yield* Effect.forkScoped(Effect.repeat(round, Schedule.spaced(options?.probeIntervalMillis ?? 5_000)))
      return dispatcher
    }),
  )
