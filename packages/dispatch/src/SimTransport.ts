/**
 * The embedded swarm: simulated nodes behind the same `SwarmNode` interface as
 * real ones.
 */
import { makeSwarm, type SimEvent, type SimNode } from "@swarmgate/swarm-sim"
import { Chunk, Effect, Option, type Scope } from "effect"
import {
  generateFromOpen,
  type NodeEvent,
  NodeFailure,
  type NodePull,
  type NodeRequest,
  type SwarmNode,
} from "./NodeTransport"
import type { Preset } from "./Presets"

const toNodeEvent = (event: SimEvent): NodeEvent =>
  event._tag === "Piece" ? { _tag: "Delta", text: event.text } : { _tag: "Finish", reason: event.reason }

export const fromSimNode = (node: SimNode, presets: ReadonlyArray<Preset>): SwarmNode => {
  const id = node.profile.id
  const input = (request: NodeRequest) => {
    const images = request.messages.flatMap((m) =>
      m.images.map((i) => ({ mediaType: i.mediaType, bytes: i.bytes })),
    )
    return {
      messages: request.messages.map((m) => ({ role: m.role, content: m.content })),
      maxTokens: request.maxTokens,
      jsonMode: request.jsonMode,
      seed: request.sampling.seed,
      temperature: request.sampling.temperature,
      stop: request.sampling.stop,
      images: images.length > 0 ? images : undefined,
    }
  }
  const failure = (reason: string) => new NodeFailure({ nodeId: id, reason })
  const open = (request: NodeRequest, scope: Scope.Scope) =>
    Effect.map(
      node.openIn(input(request), scope, { idleTimeoutMillis: request.idleTimeoutMillis }),
      (pull): NodePull =>
        Effect.mapBoth(pull, {
          onFailure: Option.map((f) => failure(f.reason)),
          onSuccess: Chunk.map(toNodeEvent),
        }),
    )
  return {
    id,
    capacity: node.profile.capacity,
    models: new Map(presets.map((p) => [p.id, `sim-${p.id}`])),
    vision: node.profile.vision,
    // The simulated node fails its own stalls as `stalled` after the request's idle limit.
    enforcesIdleTimeout: true,
    generate: generateFromOpen(open),
    open,
  }
}

export interface SimSwarmOptions {
  readonly seed: number
  readonly count: number
  readonly speed: number
}

export const makeSimSwarm = (
  options: SimSwarmOptions,
  presets: ReadonlyArray<Preset>,
): ReadonlyArray<SwarmNode> => makeSwarm(options).map((node) => fromSimNode(node, presets))
