/**
 * The embedded swarm: simulated nodes behind the same `SwarmNode` interface as
 * real ones.
 */
import { makeSwarm, type SimEvent, type SimNode, type SimNodeFailure } from "@swarmgate/swarm-sim"
import { Cause, Chunk, Effect, Exit, Option, type Scope } from "effect"
import {
  generateFromOpen,
  type NodeClock,
  type NodeEvent,
  NodeFailure,
  type NodeNext,
  type NodePull,
  type NodeRequest,
  type NodeStart,
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
  const nodeExit = (
    exit: Exit.Exit<Chunk.Chunk<SimEvent>, Option.Option<SimNodeFailure>>,
  ): Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> => {
    if (Exit.isSuccess(exit)) return Exit.succeed(Chunk.map(exit.value, toNodeEvent))
    const error = Cause.failureOption(exit.cause)
    return Option.isSome(error) && Option.isSome(error.value)
      ? Exit.fail(Option.some(failure(error.value.value.reason)))
      : (exit as Exit.Exit<never, Option.Option<never>>)
  }
  // By callback on the request's clock: the dispatcher starts an attempt on no fiber.
  const begin = (
    request: NodeRequest,
    onFirst: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void,
    clock: NodeClock,
  ): NodeStart => {
    const started = node.begin(input(request), clock, { idleTimeoutMillis: request.idleTimeoutMillis })
    // The read in progress's callback, behind one mapping made per answer (not one per read).
    let reading: ((exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void) | undefined
    const mapped = (exit: Exit.Exit<Chunk.Chunk<SimEvent>, Option.Option<SimNodeFailure>>) => {
      const done = reading
      reading = undefined
      done?.(nodeExit(exit))
    }
    const next: NodeNext = (done) => {
      reading = done
      return started.next(mapped)
    }
    next(onFirst)
    return {
      pull: Effect.async((resume) => {
        const cancel = next(resume)
        return Effect.sync(cancel)
      }),
      next,
      stop: started.stop,
    }
  }
  return {
    id,
    begin,
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
