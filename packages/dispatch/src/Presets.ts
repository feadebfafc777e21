/**
 * Model presets: what `GET /v1/models` lists and what a request's `model` selects.
 */
import { Either, ParseResult, Schema } from "effect"

export interface ConsensusParams {
  /** Nodes asked for an answer. */
  readonly k: number
  /** Answers needed before ranking once the deadline has passed. */
  readonly quorum: number
  /** Judge nodes asked to compare each pair of answers. */
  readonly judges: number
  /** From the fan-out: after this, ranking starts with the answers in (at least `quorum`). */
  readonly deadlineMillis: number
}

export interface Preset {
  readonly id: string
  readonly created: number
  readonly ownedBy: string
  readonly strategy: "single" | "consensus"
  /** Whether image parts are accepted at all (and then only by vision nodes). */
  readonly vision: boolean
  readonly maxContextTokens: number
  readonly maxOutputTokens: number
  /** Total running time before 504 `upstream_timeout`. */
  readonly timeoutMillis: number
  /** Used when `strategy` is `consensus`. */
  readonly consensus: ConsensusParams
}

/** 2026-11-01T00:00:00Z: a fixed creation time keeps `/v1/models` stable across restarts. */
const CREATED = 1_793_491_200

export const defaultConsensus: ConsensusParams = { k: 3, quorum: 2, judges: 3, deadlineMillis: 60_000 }

export const defaultPresets = (brand = "swarm"): ReadonlyArray<Preset> => [
  {
    id: `${brand}-prime`,
    created: CREATED,
    ownedBy: brand,
    // The swarm's answer: k nodes write, their peers judge (README: The swarm).
    strategy: "consensus",
    vision: true,
    maxContextTokens: 32_768,
    maxOutputTokens: 4_096,
    timeoutMillis: 300_000,
    consensus: defaultConsensus,
  },
  {
    id: `${brand}-swift`,
    created: CREATED,
    ownedBy: brand,
    strategy: "single",
    vision: false,
    maxContextTokens: 16_384,
    maxOutputTokens: 2_048,
    timeoutMillis: 120_000,
    consensus: defaultConsensus,
  },
]

// --- overrides (SWARMGATE_PRESETS) -------------------------------------------------------

const PositiveInt = Schema.Int.pipe(Schema.positive())

const Override = Schema.Struct({
  strategy: Schema.optional(Schema.Literal("single", "consensus")),
  timeout_ms: Schema.optional(PositiveInt),
  consensus: Schema.optional(
    Schema.Struct({
      k: Schema.optional(PositiveInt),
      quorum: Schema.optional(PositiveInt),
      judges: Schema.optional(Schema.Int.pipe(Schema.nonNegative())),
      deadline_ms: Schema.optional(PositiveInt),
    }),
  ),
})

/** `{"<preset id>": {strategy?, timeout_ms?, consensus?: {k?, quorum?, judges?, deadline_ms?}}}` */
export const Overrides = Schema.Record({ key: Schema.String, value: Override })
export type Overrides = typeof Overrides.Type

/**
 * Applies per-preset overrides (the JSON of `SWARMGATE_PRESETS`). Unknown
 * preset ids and a quorum above k are refused with a message naming them.
 */
export const applyOverrides = (
  presets: ReadonlyArray<Preset>,
  json: unknown,
): Either.Either<ReadonlyArray<Preset>, string> => {
  const decoded = Schema.decodeUnknownEither(Overrides)(json)
  if (Either.isLeft(decoded)) return Either.left(ParseResult.TreeFormatter.formatErrorSync(decoded.left))
  const overrides = decoded.right
  const unknown = Object.keys(overrides).filter((id) => !presets.some((p) => p.id === id))
  if (unknown.length > 0) return Either.left(`unknown preset ${unknown.join(", ")}`)
  const out: Array<Preset> = []
  for (const preset of presets) {
    const o = overrides[preset.id]
    if (o === undefined) {
      out.push(preset)
      continue
    }
    const consensus: ConsensusParams = {
      k: o.consensus?.k ?? preset.consensus.k,
      quorum: o.consensus?.quorum ?? preset.consensus.quorum,
      judges: o.consensus?.judges ?? preset.consensus.judges,
      deadlineMillis: o.consensus?.deadline_ms ?? preset.consensus.deadlineMillis,
    }
    if (consensus.quorum > consensus.k) return Either.left(`${preset.id}: quorum above k`)
    out.push({
      ...preset,
      strategy: o.strategy ?? preset.strategy,
      timeoutMillis: o.timeout_ms ?? preset.timeoutMillis,
      consensus,
    })
  }
  return Either.right(out)
}
