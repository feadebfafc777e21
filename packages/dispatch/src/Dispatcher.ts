/**
 * Runs a request on the swarm: the service other packages use. The parts
 * are in their own modules:
 *
 * - `NodePool.ts` — membership (static nodes, registered nodes with expiry,
 *   draining), health with a circuit breaker, slots and the dispatch queue;
 * - `Attempt.ts` — one attempt on one node, and the alarm that times it;
 * - `strategies/Single.ts` — one node, replaced on failure, hedged when late;
 * - `strategies/Consensus.ts` — k authors, judges, and `BradleyTerry.ts`.
 *
 * Every slot on a node is held in the caller's scope and released exactly once.
 */
import type { CapacityExhausted, UpstreamError } from "@swarmgate/protocol"
import { Clock, Context, Effect, Layer, type Runtime, Schedule, Scope } from "effect"
import { defaultHealthOptions, type HealthOptions } from "./NodeHealth"
import { httpNode, NodePool, type NodeStatus, type RegisterResult } from "./NodePool"
import type { NodeSpec } from "./NodesFile"
import type { NodeRequest, SwarmNode } from "./NodeTransport"
import type { Preset } from "./Presets"
import { consensus } from "./strategies/Consensus"
import { type Begun, beginSingle, single } from "./strategies/Single"
import type { ConsensusTrace, NodeRun, StrategyContext } from "./strategies/Strategy"

export type { NodeStatus, RegisterResult } from "./NodePool"
export type { Begun } from "./strategies/Single"
export type { ConsensusTrace, NodeRun } from "./strategies/Strategy"

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

export interface DispatcherShape {
  readonly presets: ReadonlyArray<Preset>
  readonly preset: (id: string) => Preset | undefined
  /** Active (not draining) nodes serving the preset. */
  readonly nodesFor: (presetId: string) => ReadonlyArray<SwarmNode>
  /** Whether an active node serving the preset accepts images; O(1), cached until membership changes. */
  readonly visionFor: (presetId: string) => boolean
  readonly inFlight: (nodeId: string) => number
  /**
   * Runs the request by the preset's strategy. Fails before generation with
   * 429 `capacity_exhausted`: no free node within the queue wait, or every
   * node tried refused or failed before its first token (nothing generated).
   */
  readonly run: (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ) => Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope>
  /**
   * `run` in the scope given rather than the fiber's: a caller that keeps
   * its scope out of the fiber's context spares every request a copy of it
   * (the gateway: ~2.5 KB and ~1 µs a request).
   */
  readonly runIn: (
    scope: Scope.Scope,
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ) => Effect.Effect<NodeRun, CapacityExhausted | UpstreamError>
  /**
   * `runIn` begun by plain calls, on no fiber: `done` gets the run as an
   * `Exit` when it came without a wait in Effect (the single strategy on a
   * node free now and started by callback), else the Effect that goes on.
   * Called once, perhaps before this returns. `runtime` gives the clock and
   * draws, and runs what needs a fiber (a node opened by Effect, an alarm on
   * a test clock).
   */
  readonly beginIn: (
    scope: Scope.Scope,
    runtime: Runtime.Runtime<never>,
    preset: Preset,
    request: Omit<NodeRequest, "model">,
    done: Begun,
  ) => void
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

/** The health options with the caller's overrides (once per dispatcher). */
const healthOptionsOf = (options: DispatcherOptions): HealthOptions => ({
  ...defaultHealthOptions,
  ...options.health,
})

export const make = (
  presets: ReadonlyArray<Preset>,
  nodes: ReadonlyArray<SwarmNode>,
  options: DispatcherOptions = {},
): DispatcherShape => {
  const health = healthOptionsOf(options)
  const pool = new NodePool(presets, nodes, {
    queueMax: options.queueMax ?? 256,
    probeIntervalMillis: options.probeIntervalMillis ?? 5_000,
    registrationTtlMillis: options.registrationTtlMillis ?? 30_000,
    health,
    makeNode: options.makeNode ?? httpNode,
  })
  const ctx: StrategyContext = {
    pool,
    attempt: {
      firstTokenTimeoutMillis: options.firstTokenTimeoutMillis ?? 30_000,
      idleTimeoutMillis: options.idleTimeoutMillis ?? 30_000,
    },
    maxAttempts: Math.max(1, options.maxAttempts ?? 3),
    queueWaitMillis: Math.max(0, options.queueWaitMillis ?? 0),
    hedgeAfterMillis: options.hedgeAfterMillis ?? 1_000,
    hedgeMinMillis: options.hedgeMinMillis ?? 20,
    judgeTimeoutMillis: options.judgeTimeoutMillis ?? 20_000,
    onConsensus: options.onConsensus,
  }
  const presetById = new Map(presets.map((p) => [p.id, p]))
  const runIn = (
    scope: Scope.Scope,
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError> =>
    preset.strategy === "consensus"
      ? // Rare and slow by nature: the scope goes into its context.
        Effect.provideService(consensus(ctx, preset, request), Scope.Scope, scope)
      : single(ctx, preset, request, scope)
  return {
    presets,
    preset: (id) => presetById.get(id),
    nodesFor: (presetId) => pool.serving(presetId).map((e) => e.node),
    visionFor: (presetId) => pool.vision(presetId),
    inFlight: (nodeId) => pool.entries.get(nodeId)?.inFlight ?? 0,
    run: (preset, request) => Effect.flatMap(Effect.scope, (scope) => runIn(scope, preset, request)),
    runIn,
    beginIn: (scope, runtime, preset, request, done) => {
      if (preset.strategy === "consensus") done(runIn(scope, preset, request))
      else beginSingle(ctx, preset, request, scope, runtime, done)
    },
    status: Effect.map(Clock.currentTimeMillis, (now) =>
      [...pool.entries.values()].map((e) => pool.statusOf(e, now)),
    ),
    register: (spec, ttlMillis) =>
      Effect.map(Clock.currentTimeMillis, (now) => pool.register(spec, now, ttlMillis)),
    drain: (nodeId) => Effect.map(Clock.currentTimeMillis, (now) => pool.drain(nodeId, now)),
    maintain: pool.maintain,
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
