/**
 * Picks a node for a preset and runs the request on it. Selection is
 * power-of-two-choices on in-flight/capacity, so load spreads without a
 * global scan; the slot is held in the caller's scope and released exactly once.
 */
import { CapacityExhausted, UpstreamError } from "@swarmgate/protocol"
import { Context, Effect, ExecutionStrategy, Exit, Layer, Random, Scope, Stream } from "effect"
import type { NodeEvent, NodeFailure, NodeRequest, SwarmNode } from "./NodeTransport"
import type { Preset } from "./Presets"

export interface DispatcherOptions {
  /** Nodes tried for one request when they fail before the first token. */
  readonly maxAttempts: number
}

export interface NodeRun {
  readonly nodeId: string
  /** Starts with the first event already received: failures before it were retried. */
  readonly events: Stream.Stream<NodeEvent, NodeFailure>
}

export interface DispatcherShape {
  readonly presets: ReadonlyArray<Preset>
  readonly preset: (id: string) => Preset | undefined
  readonly nodesFor: (presetId: string) => ReadonlyArray<SwarmNode>
  readonly inFlight: (nodeId: string) => number
  /**
   * Runs the request on one node. Fails before generation with 429
   * `capacity_exhausted` (no free node) or 502 `upstream_error` (every
   * attempt failed before its first token).
   */
  readonly run: (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
  ) => Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope>
}

export class Dispatcher extends Context.Tag("@swarmgate/dispatch/Dispatcher")<
  Dispatcher,
  DispatcherShape
>() {}

const capacityExhausted = (preset: Preset) =>
  new CapacityExhausted({
    message: `No capacity for ${preset.id} right now; retry after the indicated delay.`,
    retryAfterSeconds: 1,
  })

export const make = (
  presets: ReadonlyArray<Preset>,
  nodes: ReadonlyArray<SwarmNode>,
  options: DispatcherOptions = { maxAttempts: 3 },
): DispatcherShape => {
  const inFlight = new Map<string, number>(nodes.map((n) => [n.id, 0]))
  const byPreset = new Map(presets.map((p) => [p.id, nodes.filter((n) => n.models.has(p.id))]))
  const presetById = new Map(presets.map((p) => [p.id, p]))
  const load = (node: SwarmNode) => (inFlight.get(node.id) ?? 0) / node.capacity

  const pick = (candidates: ReadonlyArray<SwarmNode>, exclude: ReadonlySet<string>) =>
    Effect.gen(function* () {
      const free = candidates.filter((n) => !exclude.has(n.id) && (inFlight.get(n.id) ?? 0) < n.capacity)
      if (free.length === 0) return undefined
      if (free.length === 1) return free[0]
      const a = yield* Random.nextIntBetween(0, free.length)
      let b = yield* Random.nextIntBetween(0, free.length - 1)
      if (b >= a) b++
      const first = free[a]!
      const second = free[b]!
      return load(first) <= load(second) ? first : second
    })

  const slot = (node: SwarmNode) =>
    Effect.acquireRelease(
      Effect.sync(() => inFlight.set(node.id, (inFlight.get(node.id) ?? 0) + 1)),
      () => Effect.sync(() => inFlight.set(node.id, (inFlight.get(node.id) ?? 1) - 1)),
    )

  const attempt = (
    preset: Preset,
    request: Omit<NodeRequest, "model">,
    tried: Set<string>,
    remaining: number,
  ): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope> =>
    Effect.gen(function* () {
      const node = yield* pick(byPreset.get(preset.id) ?? [], tried)
      if (node === undefined) {
        return yield* tried.size === 0
          ? Effect.fail(capacityExhausted(preset))
          : Effect.fail(new UpstreamError({ message: "Every node tried failed before generating." }))
      }
      tried.add(node.id)
      // The slot and the node stream live in a child scope so a failed attempt frees its node at once.
      const scope = yield* Effect.scope
      const child = yield* Scope.fork(scope, ExecutionStrategy.sequential)
      yield* Scope.extend(slot(node), child)
      const stream = node.generate({ ...request, model: node.models.get(preset.id) ?? preset.id })
      const pull = yield* Scope.extend(Stream.toPull(stream), child)
      const first = yield* Effect.either(pull)
      if (first._tag === "Left") {
        yield* Scope.close(child, Exit.void)
        if (first.left._tag === "None" || remaining <= 1) {
          if (first.left._tag === "None") return { nodeId: node.id, events: Stream.empty }
          return yield* Effect.fail(
            new UpstreamError({ message: "The request failed before generation on every node tried." }),
          )
        }
        return yield* attempt(preset, request, tried, remaining - 1)
      }
      const rest: Stream.Stream<NodeEvent, NodeFailure> = Stream.repeatEffectChunkOption(pull)
      return { nodeId: node.id, events: Stream.concat(Stream.fromChunk(first.right), rest) }
    })

  return {
    presets,
    preset: (id) => presetById.get(id),
    nodesFor: (presetId) => byPreset.get(presetId) ?? [],
    inFlight: (nodeId) => inFlight.get(nodeId) ?? 0,
    run: (preset, request) => attempt(preset, request, new Set(), options.maxAttempts),
  }
}

export const layer = (
  presets: ReadonlyArray<Preset>,
  nodes: ReadonlyArray<SwarmNode>,
  options?: DispatcherOptions,
) => Layer.sync(Dispatcher, () => make(presets, nodes, options))
