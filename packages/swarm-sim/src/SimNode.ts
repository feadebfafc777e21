/**
 * A simulated model node: streams the pieces of a generated answer with realistic
 * timing and, per its profile, fails in the ways real nodes do.
 */
import { Data, Duration, Effect, Stream } from "effect"
import { hashString, makePrng } from "./internal/Prng"
import { parseJudgeRequest, verdict } from "./Judging"
import { makeProfiles, type NodeProfile, type ProfileOptions } from "./Profiles"
import { type GenerationInput, generate as generateText } from "./TextGenerator"

export class SimNodeFailure extends Data.TaggedError("SimNodeFailure")<{
  readonly nodeId: string
  readonly reason: "refused" | "failed_before_first_token" | "broke_mid_stream" | "stalled"
}> {}

export type SimEvent =
  | { readonly _tag: "Piece"; readonly text: string }
  | { readonly _tag: "Finish"; readonly reason: "stop" | "length" }

export interface SimNodeStats {
  /** Generations whose stream has been run. */
  readonly started: number
  /** Generations whose stream is running now (released on completion, failure or interruption). */
  readonly active: number
  /** Pieces emitted by this node since it was made. */
  readonly piecesEmitted: number
}

export interface SimNode {
  readonly profile: NodeProfile
  /**
   * Streams `Piece` events then one `Finish`. Each run of the stream draws a fresh
   * random seed from the node, so retrying the same stream value re-rolls failures.
   */
  readonly generate: (input: GenerationInput) => Stream.Stream<SimEvent, SimNodeFailure>
  readonly stats: Effect.Effect<SimNodeStats>
}

// Tokens of a real stream do not arrive on a metronome.
const PIECE_JITTER = 0.2

export const makeSimNode = (
  profile: NodeProfile,
  options: { readonly speed: number; readonly seed: number },
): SimNode => {
  const { speed } = options
  if (!(speed > 0)) throw new RangeError(`speed must be positive: ${speed}`)
  const calls = makePrng(hashString(`node\u0000${options.seed}\u0000${profile.id}`))
  let started = 0
  let active = 0
  let piecesEmitted = 0

  const sleep = (ms: number): Effect.Effect<void> => {
    const scaled = ms / speed
    return scaled > 0 && Number.isFinite(scaled) ? Effect.sleep(Duration.millis(scaled)) : Effect.void
  }
  const fail = (reason: SimNodeFailure["reason"]) => new SimNodeFailure({ nodeId: profile.id, reason })

  const run = (input: GenerationInput): Stream.Stream<SimEvent, SimNodeFailure> => {
    const rng = makePrng(calls.nextUint32())
    const textSeed = rng.nextUint32()
    const { failure } = profile
    const refuse = rng.chance(failure.refuse)
    const failBefore = rng.chance(failure.failBeforeFirstToken)
    const breakMid = rng.chance(failure.breakMidStream)
    const stall = rng.chance(failure.stall)
    const cutDraw = rng.next()
    // Drawn after the original draws so that profiles without it replay as before.
    const stallFirst =
      failure.stallBeforeFirstToken !== undefined && rng.chance(failure.stallBeforeFirstToken)
    const ttft = profile.ttftMs * Math.max(0, 1 + profile.ttftJitter * (rng.next() * 2 - 1))
    const gap = () => (1000 / profile.tokensPerSecond) * (1 + PIECE_JITTER * (rng.next() * 2 - 1))

    if (refuse || (input.images !== undefined && input.images.length > 0 && !profile.vision)) {
      return Stream.fail(fail("refused"))
    }
    if (failBefore)
      return Stream.fromEffect(Effect.zipRight(sleep(ttft), Effect.fail(fail("failed_before_first_token"))))
    if (stallFirst) return Stream.never

    const judging = parseJudgeRequest(input.messages)
    const generation =
      judging === undefined
        ? generateText({ ...input, quality: input.quality ?? profile.quality, ring: profile.ring }, textSeed)
        : {
            pieces: input.maxTokens >= 1 ? [verdict(profile, judging, makePrng(textSeed))] : [],
            finishReason: input.maxTokens >= 1 ? ("stop" as const) : ("length" as const),
          }
    const total = generation.pieces.length
    let emit = total
    let tail: Effect.Effect<SimEvent, SimNodeFailure>
    if (breakMid) {
      emit = Math.min(total, 1 + Math.floor(cutDraw * Math.max(1, total - 1)))
      tail = Effect.zipRight(sleep(emit === 0 ? ttft : gap()), Effect.fail(fail("broke_mid_stream")))
    } else if (stall) {
      emit = Math.floor(cutDraw * total)
      tail = Effect.never
    } else {
      const finish: SimEvent = { _tag: "Finish", reason: generation.finishReason }
      tail = total === 0 ? Effect.as(sleep(ttft), finish) : Effect.succeed(finish)
    }
    const timed = generation.pieces.slice(0, emit).map((text, i) => ({ text, delay: i === 0 ? ttft : gap() }))

    return Stream.fromIterable(timed).pipe(
      Stream.mapEffect(({ delay, text }) =>
        Effect.as(
          Effect.zipRight(
            sleep(delay),
            Effect.sync(() => {
              piecesEmitted++
            }),
          ),
          { _tag: "Piece", text } satisfies SimEvent as SimEvent,
        ),
      ),
      Stream.concat(Stream.fromEffect(tail)),
    )
  }

  return {
    profile,
    generate: (input) =>
      Stream.unwrapScoped(
        Effect.acquireRelease(
          Effect.sync(() => {
            started++
            active++
            return run(input)
          }),
          () =>
            Effect.sync(() => {
              active--
            }),
        ),
      ),
    stats: Effect.sync(() => ({ started, active, piecesEmitted })),
  }
}

export const makeSwarm = (
  options: Omit<ProfileOptions, "count"> & {
    readonly count?: number | undefined
    readonly speed: number
  },
): ReadonlyArray<SimNode> =>
  makeProfiles({ ...options, count: options.count ?? 16 }).map((profile) =>
    makeSimNode(profile, { speed: options.speed, seed: options.seed }),
  )
