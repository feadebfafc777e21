/**
 * What the dispatcher needs from a node, whatever carries it: the embedded
 * simulator or an OpenAI-compatible HTTP server.
 */
import { type Chunk, Data, Effect, type Exit, type Option, type Scope, Stream } from "effect"

export interface Sampling {
  readonly temperature?: number | undefined
  readonly topP?: number | undefined
  readonly seed?: number | undefined
  readonly stop?: ReadonlyArray<string> | undefined
  readonly presencePenalty?: number | undefined
  readonly frequencyPenalty?: number | undefined
  readonly user?: string | undefined
}

export interface NodeImage {
  readonly url: string
  readonly mediaType: string
  readonly bytes: number
}

export interface NodeMessage {
  readonly role: "system" | "user" | "assistant"
  /** Text parts joined; images travel separately. */
  readonly content: string
  readonly images: ReadonlyArray<NodeImage>
}

export interface NodeRequest {
  readonly requestId: string
  /** The node's own model name for the preset. */
  readonly model: string
  readonly messages: ReadonlyArray<NodeMessage>
  readonly maxTokens: number
  readonly jsonMode: boolean
  readonly sampling: Sampling
  /**
   * A running stream silent this long fails as `stalled` (0 or absent: no
   * limit). Honoured by nodes with `enforcesIdleTimeout`; the dispatcher
   * times the others itself.
   */
  readonly idleTimeoutMillis?: number | undefined
}

export type NodeEvent =
  | { readonly _tag: "Delta"; readonly text: string }
  | { readonly _tag: "Finish"; readonly reason: "stop" | "length" }

/**
 * The next events of a running answer: a chunk (possibly empty), or fails
 * with `None` at the end and `Some(failure)` when the node failed.
 */
export type NodePull = Effect.Effect<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>

export class NodeFailure extends Data.TaggedError("NodeFailure")<{
  readonly nodeId: string
  readonly reason: string
}> {}

/**
 * A pull by callback: calls `done` once with the next chunk, the end
 * (`None`) or the failure; returns the cancel. What the gateway reads a
 * winning HTTP node with, so a streamed token costs no Effect step. One read
 * at a time; a cancel is called only while its read waits (readers pass one
 * callback to every read, so a late cancel could end a later read).
 */
export type NodeNext = (
  done: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void,
) => () => void

/**
 * The request's clock, for a node started by callback that keeps time
 * itself (the simulator): Node's timers on the real clock, the test clock in
 * tests.
 */
export interface NodeClock {
  readonly now: () => number
  /** Calls `fire` after `millis`; returns the cancel. */
  readonly alarm: (millis: number, fire: () => void) => () => void
}

/** An answer started by `SwarmNode.begin`. */
export interface NodeStart {
  /** The events after the first ones reported. */
  readonly pull: NodePull
  /** `pull` by callback (read one or the other). */
  readonly next?: NodeNext | undefined
  /** Ends the answer: aborts the node unless it already finished. Idempotent. */
  readonly stop: () => void
}

export interface SwarmNode {
  readonly id: string
  /** Where an HTTP node lives; absent for in-process nodes. */
  readonly url?: string | undefined
  readonly capacity: number
  /** Preset id → the node's model name for it. */
  readonly models: ReadonlyMap<string, string>
  readonly vision: boolean
  readonly generate: (request: NodeRequest) => Stream.Stream<NodeEvent, NodeFailure>
  /**
   * The same answer as a pull, held by `scope` (given, not provided: no
   * context change per request): nothing is sent until the first pull.
   * Cheaper than running `generate` through a stream; when absent the
   * dispatcher pulls `generate`.
   */
  readonly open?: ((request: NodeRequest, scope: Scope.Scope) => Effect.Effect<NodePull>) | undefined
  /**
   * Starts the answer at once and reports its first events (or its failure
   * before them) to `onFirst`, by callback: what the dispatcher uses when a
   * node has it, so an attempt costs no fiber. `stop` ends the answer
   * (idempotent); after `onFirst`, `pull` gives the rest. `clock` is the
   * request's, for a node that waits itself (HTTP nodes wait on sockets).
   */
  readonly begin?:
    | ((
        request: NodeRequest,
        onFirst: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void,
        clock: NodeClock,
      ) => NodeStart)
    | undefined
  /** The node fails its own streams after `idleTimeoutMillis` of silence (cheaper than a timer per event). */
  readonly enforcesIdleTimeout?: boolean | undefined
  /** A cheap request that succeeds when the node works; nodes without one are tried with real traffic. */
  readonly probe?: Effect.Effect<void, NodeFailure> | undefined
}

/** `generate` for a node that implements `open`: the same answer, pulled as a stream. */
export const generateFromOpen =
  (open: (request: NodeRequest, scope: Scope.Scope) => Effect.Effect<NodePull>) =>
  (request: NodeRequest): Stream.Stream<NodeEvent, NodeFailure> =>
    Stream.unwrapScoped(
      Effect.flatMap(Effect.scope, (scope) =>
        Effect.map(open(request, scope), Stream.repeatEffectChunkOption),
      ),
    )
