/**
 * A simulated model node: streams the pieces of a generated answer with realistic
 * timing and, per its profile, fails in the ways real nodes do.
 */
import { Chunk, Clock, Data, Duration, Effect, Exit, Option, Scope, Stream } from "effect"
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

/** The next events of a generation (a chunk), `None` at its end, `Some(failure)` when it failed. */
export type SimPull = Effect.Effect<Chunk.Chunk<SimEvent>, Option.Option<SimNodeFailure>>

export interface SimOpenOptions {
  /** A generation that stalls fails as `stalled` after this long (0 or absent: it hangs until interrupted). */
  readonly idleTimeoutMillis?: number | undefined
}

/**
 * The reader's clock, for the callback form: Node's timers on the real
 * clock, the test clock in tests (the gateway's dispatcher passes its own).
 */
export interface SimClock {
  readonly now: () => number
  /** Calls `fire` after `millis`; returns the cancel. */
  readonly alarm: (millis: number, fire: () => void) => () => void
}

/** What a read by callback gets: as `SimPull`'s outcome. */
export type SimDone = (exit: Exit.Exit<Chunk.Chunk<SimEvent>, Option.Option<SimNodeFailure>>) => void

/** A generation started by `SimNode.begin`. */
export interface SimStart {
  /**
   * The next events by callback, as `SimPull` (perhaps before this
   * returns); returns the cancel of a read that waits. One read at a time.
   */
  readonly next: (done: SimDone) => () => void
  /** Ends the generation (releases it; a waiting read never completes). Idempotent. */
  readonly stop: () => void
}

export interface SimNode {
  readonly profile: NodeProfile
  /**
   * Streams `Piece` events then one `Finish`. Each run of the stream draws a fresh
   * random seed from the node, so retrying the same stream value re-rolls failures.
   */
  readonly generate: (input: GenerationInput) => Stream.Stream<SimEvent, SimNodeFailure>
  /**
   * The same generation as a pull, held by the scope. Each pull waits for the
   * next piece's time, then returns every piece that is due by then: a reader
   * that falls behind gets several at once, as from a socket, and a fast one
   * costs one pull per piece. The timeline starts at the first pull.
   */
  readonly open: (
    input: GenerationInput,
    options?: SimOpenOptions,
  ) => Effect.Effect<SimPull, never, Scope.Scope>
  /** `open` held by a given scope (no context change). */
  readonly openIn: (
    input: GenerationInput,
    scope: Scope.Scope,
    options?: SimOpenOptions,
  ) => Effect.Effect<SimPull>
  /**
   * The same generation read by callback with `clock`, on no fiber: what
   * the gateway's dispatcher starts it with. Released by `stop`.
   */
  readonly begin: (input: GenerationInput, clock: SimClock, options?: SimOpenOptions) => SimStart
  readonly stats: Effect.Effect<SimNodeStats>
}

/** A piece and when it is due, in unscaled milliseconds from the start. */
interface Timed {
  readonly text: string
  readonly at: number
}

const noCancel = () => undefined
const endedExit: Exit.Exit<never, Option.Option<never>> = Exit.fail(Option.none())

/**
 * Where a reader is in a generation's pieces and when the next is due: the
 * Effect form and the callback form step through it alike.
 */
class Timeline {
  /** The timeline starts at the first read. */
  private start: number | undefined = undefined
  private index = 0
  /** The tail (what follows the last piece) was reached. */
  done = false

  constructor(
    private readonly pieces: ReadonlyArray<Timed>,
    private readonly speed: number,
    private readonly emitted: (count: number) => void,
  ) {}

  /** Milliseconds until the next piece is due (≤ 0: due now); undefined past the last piece. */
  wait(now: number): number | undefined {
    this.start ??= now
    if (this.index >= this.pieces.length) return undefined
    return this.start + this.pieces[this.index]!.at / this.speed - now
  }

  /** Every piece due by `now` (at least the next one), in one chunk. */
  take(now: number): Chunk.Chunk<SimEvent> {
    const { pieces, speed } = this
    const start = this.start ?? 0
    const out: Array<SimEvent> = []
    do {
      out.push({ _tag: "Piece", text: pieces[this.index]!.text })
      this.index++
    } while (this.index < pieces.length && start + pieces[this.index]!.at / speed <= now)
    this.emitted(out.length)
    return Chunk.unsafeFromArray(out)
  }
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

  /** What one generation will do, drawn from the node's seeded sequence. */
  type Plan =
    | { readonly _tag: "Fail"; readonly after: number; readonly reason: SimNodeFailure["reason"] }
    | { readonly _tag: "Stall"; readonly pieces: ReadonlyArray<Timed> }
    | {
        readonly _tag: "Pieces"
        readonly pieces: ReadonlyArray<Timed>
        /** After the last piece: its Finish (`at` the end of the wait), or a break. */
        readonly tail:
          | { readonly _tag: "Finish"; readonly reason: "stop" | "length"; readonly wait: number }
          | { readonly _tag: "Break"; readonly wait: number }
      }

  const plan = (input: GenerationInput): Plan => {
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
      return { _tag: "Fail", after: 0, reason: "refused" }
    }
    if (failBefore) return { _tag: "Fail", after: ttft, reason: "failed_before_first_token" }
    if (stallFirst) return { _tag: "Stall", pieces: [] }

    const judging = parseJudgeRequest(input.messages)
    const generation =
      judging === undefined
        ? generateText({ ...input, quality: input.quality ?? profile.quality, ring: profile.ring }, textSeed)
        : {
            pieces: input.maxTokens >= 1 ? [verdict(profile, judging, makePrng(textSeed))] : [],
            finishReason: input.maxTokens >= 1 ? ("stop" as const) : ("length" as const),
          }
    const total = generation.pieces.length
    const timed = (emit: number): Array<Timed> => {
      const out: Array<Timed> = []
      let at = 0
      for (let i = 0; i < emit; i++) {
        at += i === 0 ? ttft : gap()
        out.push({ text: generation.pieces[i]!, at })
      }
      return out
    }
    if (breakMid) {
      const emit = Math.min(total, 1 + Math.floor(cutDraw * Math.max(1, total - 1)))
      const pieces = timed(emit)
      return { _tag: "Pieces", pieces, tail: { _tag: "Break", wait: emit === 0 ? ttft : gap() } }
    }
    if (stall) return { _tag: "Stall", pieces: timed(Math.floor(cutDraw * total)) }
    return {
      _tag: "Pieces",
      pieces: timed(total),
      tail: { _tag: "Finish", reason: generation.finishReason, wait: total === 0 ? ttft : 0 },
    }
  }

  const ended: SimPull = Effect.fail(Option.none())

  /** The Effect form of a generation: `Timeline`'s steps, waited with the fiber's clock. */
  const pullOf = (planned: Plan, idleTimeoutMillis: number): SimPull => {
    if (planned._tag === "Fail") {
      const failed = Effect.fail(Option.some(fail(planned.reason)))
      return Effect.zipRight(sleep(planned.after), failed)
    }
    const line = new Timeline(planned.pieces, speed, emitted)
    const tail: SimPull = Effect.suspend(() => {
      line.done = true
      if (planned._tag === "Stall") {
        return idleTimeoutMillis > 0
          ? Effect.zipRight(
              Effect.sleep(Duration.millis(idleTimeoutMillis)),
              Effect.fail(Option.some(fail("stalled"))),
            )
          : Effect.never
      }
      const end = planned.tail
      return end._tag === "Finish"
        ? Effect.as(sleep(end.wait), Chunk.of<SimEvent>({ _tag: "Finish", reason: end.reason }))
        : Effect.zipRight(sleep(end.wait), Effect.fail(Option.some(fail("broke_mid_stream"))))
    })
    const take = (now: number) => line.take(now)
    return Effect.flatMap(Clock.currentTimeMillis, (now) => {
      if (line.done) return ended
      const wait = line.wait(now)
      if (wait === undefined) return tail
      if (!(wait > 0) || !Number.isFinite(wait)) return Effect.succeed(line.take(now))
      return Effect.zipRight(Effect.sleep(Duration.millis(wait)), Effect.map(Clock.currentTimeMillis, take))
    })
  }

  /** The callback form of a generation: the same steps, waited with `clock`'s alarm. */
  const startOf = (planned: Plan, idleTimeoutMillis: number, clock: SimClock): SimStart => {
    let cancel: () => void = noCancel
    let stopped = false
    const after = (millis: number, then: () => void): (() => void) => {
      const scaled = millis / speed
      if (!(scaled > 0) || !Number.isFinite(scaled)) {
        then()
        return noCancel
      }
      cancel = clock.alarm(scaled, () => {
        cancel = noCancel
        then()
      })
      return cancel
    }
    const stop = () => {
      if (stopped) return
      stopped = true
      cancel()
      cancel = noCancel
      active--
    }
    if (planned._tag === "Fail") {
      const failed = Exit.fail(Option.some(fail(planned.reason)))
      let over = false
      return {
        next: (done) => {
          if (stopped) return noCancel
          if (over) {
            done(endedExit)
            return noCancel
          }
          return after(planned.after, () => {
            over = true
            done(failed)
          })
        },
        stop,
      }
    }
    const line = new Timeline(planned.pieces, speed, emitted)
    const tail = (done: SimDone): (() => void) => {
      line.done = true
      if (planned._tag === "Stall") {
        if (!(idleTimeoutMillis > 0)) return noCancel
        // Unscaled, as in the Effect form: the idle limit is the gateway's time, not the node's.
        cancel = clock.alarm(idleTimeoutMillis, () => {
          cancel = noCancel
          done(Exit.fail(Option.some(fail("stalled"))))
        })
        return cancel
      }
      const end = planned.tail
      return end._tag === "Finish"
        ? after(end.wait, () =>
            done(Exit.succeed(Chunk.of<SimEvent>({ _tag: "Finish", reason: end.reason }))),
          )
        : after(end.wait, () => done(Exit.fail(Option.some(fail("broke_mid_stream")))))
    }
    return {
      next: (done) => {
        if (stopped) return noCancel
        if (line.done) {
          done(endedExit)
          return noCancel
        }
        const now = clock.now()
        const wait = line.wait(now)
        if (wait === undefined) return tail(done)
        if (!(wait > 0) || !Number.isFinite(wait)) {
          done(Exit.succeed(line.take(now)))
          return noCancel
        }
        cancel = clock.alarm(wait, () => {
          cancel = noCancel
          done(Exit.succeed(line.take(clock.now())))
        })
        return cancel
      },
      stop,
    }
  }

  const emitted = (count: number) => {
    piecesEmitted += count
  }

  const openIn = (input: GenerationInput, scope: Scope.Scope, options: SimOpenOptions = {}) =>
    Effect.suspend(() => {
      started++
      active++
      return Effect.as(
        Scope.addFinalizer(
          scope,
          Effect.sync(() => {
            active--
          }),
        ),
        pullOf(plan(input), options.idleTimeoutMillis ?? 0),
      )
    })
  const open = (input: GenerationInput, options: SimOpenOptions = {}) =>
    Effect.flatMap(Effect.scope, (scope) => openIn(input, scope, options))
  const begin = (input: GenerationInput, clock: SimClock, options: SimOpenOptions = {}) => {
    started++
    active++
    return startOf(plan(input), options.idleTimeoutMillis ?? 0, clock)
  }

  return {
    profile,
    generate: (input) => Stream.unwrapScoped(Effect.map(open(input), Stream.repeatEffectChunkOption)),
    open,
    openIn,
    begin,
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
