/**
 * The embedded swarm: simulated nodes behind the same `SwarmNode` interface as
 * real ones.
 */
import { makeSwarm, type SimNode } from "@swarmgate/swarm-sim"
import { Stream } from "effect"
import { type NodeEvent, NodeFailure, type SwarmNode } from "./NodeTransport"
import type { Preset } from "./Presets"

export const fromSimNode = (node: SimNode, presets: ReadonlyArray<Preset>): SwarmNode => {
  const id = node.profile.id
  return {
    id,
    capacity: node.profile.capacity,
    models: new Map(presets.map((p) => [p.id, `sim-${p.id}`])),
    vision: node.profile.vision,
    generate: (request) => {
      const images = request.messages.flatMap((m) =>
        m.images.map((i) => ({ mediaType: i.mediaType, bytes: i.bytes })),
      )
      return node
        .generate({
          messages: request.messages.map((m) => ({ role: m.role, content: m.content })),
          maxTokens: request.maxTokens,
          jsonMode: request.jsonMode,
          seed: request.sampling.seed,
          temperature: request.sampling.temperature,
          stop: request.sampling.stop,
          images: images.length > 0 ? images : undefined,
        })
        .pipe(
          Stream.map(
            (event): NodeEvent =>
              event._tag === "Piece"
                ? { _tag: "Delta", text: event.text }
                : { _tag: "Finish", reason: event.reason },
          ),
          Stream.mapError((failure) => new NodeFailure({ nodeId: id, reason: failure.reason })),
        )
    },
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
