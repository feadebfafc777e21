/**
 * The nodes a dispatcher can use: membership (nodes of the nodes file,
 * registered nodes with expiry, draining), per-node health, and the slots
 * requests hold on them, with the bounded queue of requests waiting for a
 * free node. Choosing a node costs the same for 10 nodes as for 1,000: a
 * few random probes, a full scan only when nearly everything is busy.
 */
import { Clock, Deferred, Effect, Either, Exit, FiberId, Random, Scope, Stream } from "effect"
import * as HttpTransport from "./HttpTransport"
import { type HealthOptions, type HealthSnapshot, NodeHealth, percentile } from "./NodeHealth"
import type { NodeSpec } from "./NodesFile"
import type { NodePull, NodeRequest, SwarmNode } from "./NodeTransport"
import type { Preset } from "./Presets"

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

export type RegisterResult = Either.Either<{ readonly created: boolean; readonly node: NodeStatus }, string>

export interface Entry {
  node: SwarmNode
  readonly health: NodeHealth
  inFlight: number
  state: "active" | "draining"
  readonly source: "static" | "registered"
  expiresAt: number | undefined
  spec: NodeSpec | undefined
  hedges: number
}

/** A request's place on a node, released exactly once. */
export interface Slot {
  readonly entry: Entry
  readonly trial: number | undefined
}

export interface PoolOptions {
  readonly queueMax: number
  readonly probeIntervalMillis: number
  readonly registrationTtlMillis: number
  readonly health: HealthOptions
  readonly makeNode: (spec: NodeSpec) => SwarmNode
}

/** Latency added to every node's so that load still matters between very fast nodes. */
const LATENCY_FLOOR_MILLIS = 50
/** Pools up to this size are scanned whole (exact power-of-two choices among the free nodes). */
const SCAN_BELOW = 16
/** Random probes for two free nodes in a larger pool before falling back to a scan. */
const PROBES = 8
/** How long the swarm-wide time-to-first-token percentile is reused. */
const SWARM_P95_TTL_MILLIS = 1_000

/** The node's answer as a pull held by `scope`. */
export const openOn = (node: SwarmNode, request: NodeRequest, scope: Scope.Scope): Effect.Effect<NodePull> =>
  node.open !== undefined
    ? node.open(request, scope)
    : Scope.extend(Stream.toPull(node.generate(request)), scope)

export class NodePool {
  readonly entries = new Map<string, Entry>()
  private servingCache: Map<string, Array<Entry>> | undefined
  private visionCache: Map<string, boolean> | undefined
  private readonly waiters = new Set<Deferred.Deferred<void>>()
  private readonly swarmP95 = new Map<string, { readonly value: number | undefined; readonly at: number }>()

  constructor(
    readonly presets: ReadonlyArray<Preset>,
    nodes: ReadonlyArray<SwarmNode>,
    readonly options: PoolOptions,
  ) {
    for (const node of nodes) {
      this.entries.set(node.id, {
        node,
        health: new NodeHealth(options.health),
        inFlight: 0,
        state: "active",
        source: "static",
        expiresAt: undefined,
        spec: undefined,
        hedges: 0,
      })
    }
  }

  // --- membership ----------------------------------------------------------------------------

  /** Active entries serving the preset, rebuilt when membership changes (not per request). */
  serving(presetId: string): ReadonlyArray<Entry> {
    if (this.servingCache === undefined) {
      const cache = new Map(this.presets.map((p) => [p.id, [] as Array<Entry>]))
      for (const entry of this.entries.values())
        if (entry.state === "active") for (const id of entry.node.models.keys()) cache.get(id)?.push(entry)
      this.servingCache = cache
    }
    return this.servingCache.get(presetId) ?? []
  }

  /** Whether an active node serving the preset accepts images (cached like `serving`). */
  vision(presetId: string): boolean {
    if (this.visionCache === undefined) {
      this.visionCache = new Map(
        this.presets.map((p) => [p.id, this.serving(p.id).some((e) => e.node.vision)]),
      )
    }
    return this.visionCache.get(presetId) ?? false
  }

  private changed() {
    this.servingCache = undefined
    this.visionCache = undefined
  }

  private removeIfIdle(entry: Entry) {
    if (entry.state === "draining" && entry.inFlight === 0 && this.entries.get(entry.node.id) === entry) {
      this.entries.delete(entry.node.id)
      this.changed()
    }
  }

  statusOf(entry: Entry, now: number): NodeStatus {
    return {
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
    }
  }

  /** Adds a node or renews its registration (heartbeat); nodes of the nodes file cannot be replaced. */
  register(spec: NodeSpec, now: number, ttlMillis?: number): RegisterResult {
    const existing = this.entries.get(spec.id)
    const expiresAt = now + (ttlMillis ?? this.options.registrationTtlMillis)
    if (existing !== undefined && existing.source === "static") {
      return Either.left(`node ${spec.id} comes from the nodes file and cannot be registered`)
    }
    if (existing !== undefined) {
      existing.expiresAt = expiresAt
      if (!sameSpec(existing.spec, spec)) {
        existing.node = this.options.makeNode(spec)
        existing.spec = spec
        this.changed()
      }
      return Either.right({ created: false, node: this.statusOf(existing, now) })
    }
    const entry: Entry = {
      node: this.options.makeNode(spec),
      health: new NodeHealth(this.options.health),
      inFlight: 0,
      state: "active",
      source: "registered",
      expiresAt,
      spec,
      hedges: 0,
    }
    this.entries.set(spec.id, entry)
    this.changed()
    this.wakeWaiters()
    return Either.right({ created: true, node: this.statusOf(entry, now) })
  }

  /** Stops sending new requests to the node and removes it once idle; undefined if unknown. */
  drain(nodeId: string, now: number): NodeStatus | undefined {
    const entry = this.entries.get(nodeId)
    if (entry === undefined) return undefined
    entry.state = "draining"
    this.changed()
    const status = this.statusOf(entry, now)
    this.removeIfIdle(entry)
    return status
  }

  /** One round of registration expiry, removal of drained nodes and health probes. */
  readonly maintain: Effect.Effect<void> = Effect.suspend(() =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const due: Array<Effect.Effect<void>> = []
      for (const entry of [...this.entries.values()]) {
        if (entry.source === "registered" && entry.state === "active" && (entry.expiresAt ?? now) < now) {
          entry.state = "draining"
          this.changed()
        }
        this.removeIfIdle(entry)
        if (entry.state !== "active") continue
        const admits = entry.health.admits(now)
        const idle = now - entry.health.lastActivity >= this.options.probeIntervalMillis
        // Open circuits past their cool-down get their trial; quiet nodes get checked before traffic finds them dead.
        if (
          (entry.health.circuit === "half_open" && admits) ||
          (entry.health.circuit === "closed" && idle && entry.inFlight === 0)
        )
          due.push(this.probe(entry, now))
      }
      return Effect.all(due, { concurrency: "unbounded", discard: true })
    }),
  )

  private probe(entry: Entry, now: number): Effect.Effect<void> {
    const check = entry.node.probe
    if (check === undefined) return Effect.void
    const trial = entry.health.start(now)
    return Effect.flatMap(Effect.either(check), (result) =>
      Effect.flatMap(Clock.currentTimeMillis, (at) =>
        Effect.sync(() => {
          if (Either.isRight(result)) entry.health.probeSucceeded(trial)
          else entry.health.failure(at, `probe: ${result.left.reason}`, trial)
          this.wakeWaiters()
        }),
      ),
    )
  }

  // --- choosing a node -------------------------------------------------------------------------

  private latencyOf(entry: Entry) {
    return (entry.health.ttftMillis ?? 0) + LATENCY_FLOOR_MILLIS
  }

  private cost(entry: Entry) {
    return ((entry.inFlight + 1) / entry.node.capacity) * this.latencyOf(entry)
  }

  free(entry: Entry, now: number): boolean {
    return entry.state === "active" && entry.inFlight < entry.node.capacity && entry.health.admits(now)
  }

  private take(entry: Entry, now: number): Slot {
    entry.inFlight++
    return { entry, trial: entry.health.start(now) }
  }

  /**
   * Takes a slot on the cheaper of two random free candidates, in one
   * synchronous step; `r1` and `r2` are uniform draws in [0, 1).
   */
  claimNow(
    candidates: ReadonlyArray<Entry>,
    exclude: ReadonlySet<string>,
    vision: boolean,
    r1: number,
    r2: number,
    now: number,
  ): Slot | undefined {
    const eligible = (e: Entry) => !exclude.has(e.node.id) && (!vision || e.node.vision) && this.free(e, now)
    if (candidates.length >= SCAN_BELOW) {
      // Two distinct free nodes from a few random probes: O(1) while there is spare capacity.
      let first: Entry | undefined
      let second: Entry | undefined
      let x = r1
      for (let i = 0; i < PROBES && second === undefined; i++) {
        const pick = candidates[Math.floor(x * candidates.length)]!
        if (pick !== first && eligible(pick)) {
          if (first === undefined) first = pick
          else second = pick
        }
        // The next probe's draw, derived from both: deterministic for a seeded run.
        x = (x * 9301 + r2 * 49297 + 0.233) % 1
      }
      if (first !== undefined && second !== undefined)
        return this.take(this.cost(first) <= this.cost(second) ? first : second, now)
    }
    const open = candidates.filter(eligible)
    if (open.length === 0) return undefined
    let entry = open[0]!
    if (open.length > 1) {
      const a = Math.floor(r1 * open.length)
      let b = Math.floor(r2 * (open.length - 1))
      if (b >= a) b++
      const first = open[a]!
      const second = open[b]!
      entry = this.cost(first) <= this.cost(second) ? first : second
    }
    return this.take(entry, now)
  }

  /** Takes a slot on one given node if it is free now. */
  claimOn(entry: Entry, now: number): Slot | undefined {
    return this.free(entry, now) ? this.take(entry, now) : undefined
  }

  /** Gives a slot back: exactly once per slot (callers keep the books). */
  release(slot: Slot): void {
    slot.entry.inFlight--
    slot.entry.health.abandon(slot.trial)
    this.removeIfIdle(slot.entry)
    this.wakeWaiters()
  }

  private wakeWaiters() {
    if (this.waiters.size === 0) return
    const woken = [...this.waiters]
    this.waiters.clear()
    for (const waiter of woken) Deferred.unsafeDone(waiter, Exit.void)
  }

  /** Whether any untried node could serve the request at all (busy or not). */
  possible(candidates: ReadonlyArray<Entry>, exclude: ReadonlySet<string>, vision: boolean): boolean {
    return candidates.some((e) => !exclude.has(e.node.id) && (!vision || e.node.vision))
  }

  /** One synchronous try, with the draws and the time from the fiber's `Random` and `Clock`. */
  tryClaim(presetId: string, exclude: ReadonlySet<string>, vision: boolean): Effect.Effect<Slot | undefined> {
    return Effect.flatMap(Random.next, (r1) =>
      Effect.flatMap(Random.next, (r2) =>
        Effect.map(Clock.currentTimeMillis, (now) =>
          this.claimNow(this.serving(presetId), exclude, vision, r1, r2, now),
        ),
      ),
    )
  }

  /**
   * Claims a slot on a node serving `presetId` and hands it to `take` — both
   * in one uninterruptible step, so a slot is never claimed without its owner
   * — waiting up to `waitMillis` (interruptibly) in the bounded queue while
   * every eligible node is busy. Undefined when no node came free, the queue
   * is full, or no untried node could serve at all. With `triedNow`, the
   * caller has just tried `claimNow` itself: the wait starts at once.
   */
  claim<A>(
    presetId: string,
    exclude: ReadonlySet<string>,
    vision: boolean,
    waitMillis: number,
    take: (slot: Slot) => Effect.Effect<A>,
    sources?: { readonly draw: () => number; readonly now: () => number },
    triedNow = false,
  ): Effect.Effect<A | undefined> {
    const self = this
    const tryClaim =
      sources === undefined
        ? this.tryClaim(presetId, exclude, vision)
        : Effect.sync(() =>
            this.claimNow(
              this.serving(presetId),
              exclude,
              vision,
              sources.draw(),
              sources.draw(),
              sources.now(),
            ),
          )
    const attempt = Effect.uninterruptible(
      Effect.flatMap(tryClaim, (slot) =>
        slot === undefined ? Effect.succeed(undefined) : Effect.map(take(slot), (value) => ({ value })),
      ),
    )
    return Effect.flatMap(triedNow ? Effect.succeed(undefined) : attempt, (first) => {
      if (first !== undefined || waitMillis <= 0) return Effect.succeed(first?.value)
      return Effect.gen(function* () {
        const deadline = (yield* Clock.currentTimeMillis) + waitMillis
        while (true) {
          // Registered before trying, so a release between the try and the wait still wakes us.
          const waiter = Deferred.unsafeMake<void>(FiberId.none)
          self.waiters.add(waiter)
          const claimed = yield* attempt
          if (claimed !== undefined) {
            self.waiters.delete(waiter)
            return claimed.value
          }
          const remaining = deadline - (yield* Clock.currentTimeMillis)
          if (
            remaining <= 0 ||
            !self.possible(self.serving(presetId), exclude, vision) ||
            self.waiters.size > self.options.queueMax
          ) {
            self.waiters.delete(waiter)
            return undefined
          }
          yield* Deferred.await(waiter).pipe(
            Effect.timeout(remaining),
            Effect.ignore,
            Effect.ensuring(Effect.sync(() => self.waiters.delete(waiter))),
          )
        }
      })
    })
  }

  /** `claim` with the slot held by the current scope: released when it closes. */
  acquire(
    presetId: string,
    exclude: ReadonlySet<string>,
    vision: boolean,
    waitMillis: number,
  ): Effect.Effect<Slot | undefined, never, Scope.Scope> {
    return Effect.flatMap(Effect.scope, (scope) =>
      this.claim(presetId, exclude, vision, waitMillis, (slot) =>
        Effect.as(
          Scope.addFinalizer(
            scope,
            Effect.sync(() => this.release(slot)),
          ),
          slot,
        ),
      ),
    )
  }

  /** The preset's swarm-wide p95 time to first token (at least 32 samples), recomputed at most once a second. */
  swarmTtftP95(presetId: string, now: number): number | undefined {
    const cached = this.swarmP95.get(presetId)
    if (cached !== undefined && now - cached.at < SWARM_P95_TTL_MILLIS && now >= cached.at)
      return cached.value
    const pooled = this.serving(presetId).flatMap((e) => e.health.recentTtfts())
    const value = pooled.length >= 32 ? percentile(pooled, 0.95) : undefined
    this.swarmP95.set(presetId, { value, at: now })
    return value
  }
}

const sameSpec = (a: NodeSpec | undefined, b: NodeSpec) =>
  a !== undefined && JSON.stringify(a) === JSON.stringify(b)

/** The default way registered nodes are reached: OpenAI-compatible HTTP. */
export const httpNode = (spec: NodeSpec): SwarmNode => HttpTransport.fromSpec(spec)
