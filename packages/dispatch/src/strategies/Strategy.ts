/**
 * What every strategy gets from the dispatcher and hands back: the pool,
 * the limits, and the run of one answer.
 */
import { CapacityExhausted } from "@swarmgate/protocol"
import { Stream } from "effect"
import type { AttemptOptions } from "../Attempt"
import type { Vote } from "../BradleyTerry"
import type { NodePool } from "../NodePool"
import type { NodeEvent, NodeFailure, NodeNext, NodePull } from "../NodeTransport"
import type { Preset } from "../Presets"

export interface NodeRun {
  /** The node answering; for consensus `consensus:<authors>`. */
  readonly nodeId: string
  /**
   * The answer's events, a chunk per pull; starts with the first event
   * already received (failures before it were retried). Read either `pull`
   * or `events`, not both: they are one sequence.
   */
  readonly pull: NodePull
  /** `pull` by callback, when the node offers it (read one or the other). */
  readonly next?: NodeNext | undefined
  /** `pull` as a stream. */
  readonly events: Stream.Stream<NodeEvent, NodeFailure>
}

/**
 * A class, not an object literal with a getter: each literal with `get` makes
 * a hidden class of its own in the old generation, which then keeps the
 * request it captures alive through young collections (BENCHMARKS.md).
 */
class Run implements NodeRun {
  constructor(
    readonly nodeId: string,
    readonly pull: NodePull,
    readonly next: NodeNext | undefined,
  ) {}
  // Built on first use: the gateway reads `pull`, and a stream per request is garbage for nothing.
  get events(): Stream.Stream<NodeEvent, NodeFailure> {
    return Stream.repeatEffectChunkOption(this.pull)
  }
}

export const runOf = (nodeId: string, pull: NodePull, next?: NodeNext): NodeRun => new Run(nodeId, pull, next)

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
  readonly votes: ReadonlyArray<Vote>
  readonly winner: number
  /** Judges' reputations before this decision updated them. */
  readonly reputations: Readonly<Record<string, number>>
}

export interface StrategyContext {
  readonly pool: NodePool
  readonly attempt: AttemptOptions
  readonly maxAttempts: number
  readonly queueWaitMillis: number
  /** Hedge threshold for a node without enough history, when the swarm has none either (0: no hedging). */
  readonly hedgeAfterMillis: number
  readonly hedgeMinMillis: number
  readonly judgeTimeoutMillis: number
  readonly onConsensus: ((trace: ConsensusTrace) => void) | undefined
}

/**
 * 429 `capacity_exhausted`: no node could start the request — all busy, or
 * every one tried refused or failed before its first token (spec §7.3: 502
 * and 504 are for failures after generation started). Retry-After comes from
 * the nodes' state: the soonest an open circuit tries again, else the dispatch
 * queue's wait (at least 1 s); 1–60 s.
 */
export const capacityExhausted = (ctx: StrategyContext, preset: Preset, now: number = Date.now()) => {
  let waitMillis = Number.POSITIVE_INFINITY
  for (const entry of ctx.pool.serving(preset.id)) {
    const wait =
      entry.health.circuit === "open" ? entry.health.openUntil - now : Math.max(1_000, ctx.queueWaitMillis)
    if (wait < waitMillis) waitMillis = wait
  }
  // No node serves the preset at all: one may register soon.
  if (!Number.isFinite(waitMillis)) waitMillis = 5_000
  return new CapacityExhausted({
    message: `No capacity for ${preset.id} right now; retry after the indicated delay.`,
    retryAfterSeconds: Math.min(60, Math.max(1, Math.ceil(waitMillis / 1000))),
  })
}
