/**
 * How V8 runs the heap, chosen by how many requests are open (streams, and
 * anything else in flight): two levers, each left alone where the operator
 * set it on `node`'s command line.
 *
 * The old generation's growth. A stream lives for seconds, so its objects
 * outlast the young generation and die in the old one, where they stay
 * until a major collection. V8 lets the old generation grow to 1.5–4× what
 * the last one left before it starts the next: at 2,000 open streams that
 * growth, not the streams' own ~40 KB each, is most of the resident set. A
 * fixed, tighter growth (`--heap-growing-percent`) keeps it near the goal,
 * and costs no CPU per streamed token measurable at that scale; but at a
 * few dozen short JSON requests it makes major collections frequent for a
 * small live set and costs ~25 % CPU per request (BENCHMARKS.md, 2026-11-27
 * and 2026-11-28). So the growth is tight only while many requests are
 * open, and V8's own otherwise.
 *
 * The young generation's threads, on one CPU (an affinity of one core:
 * `taskset`, `docker --cpuset-cpus`; Node 20 does not count a CPU quota).
 * There the parallel scavenger's helpers only take turns with the event
 * loop, and each young collection pauses requests longer (median 0.90 →
 * 0.70 ms at one connection); with few requests open that pause is what a
 * request's tail latency is made of, so the main thread scavenges alone.
 * With many open (2,000 streams) the main thread alone left the resident
 * set 20–130 MB higher, so the helpers come back with the tight growth
 * (BENCHMARKS.md, ninth session). With more CPUs V8's own choice stands.
 *
 * V8 reads both flags at each collection, so setting them at run time
 * takes effect at the next one.
 */
import { availableParallelism } from "node:os"
import { setFlagsFromString } from "node:v8"
import { Effect, Schedule, type Scope } from "effect"

/** The old generation may grow to 1.3× what the last major collection left. */
export const TIGHT_GROWTH_PERCENT = 30

export interface HeapPolicyOptions {
  /** Open requests from which the growth is tight and scavenging parallel (0: never); back below half. */
  readonly tightAt: number
  /** How often the count is read. */
  readonly intervalMillis?: number | undefined
  /** Sets V8 flags; tests pass their own. */
  readonly setFlags?: ((flags: string) => void) | undefined
  /** Node's command-line options (default `process.execArgv`): an operator's own choice there wins. */
  readonly execArgv?: ReadonlyArray<string> | undefined
  /** CPUs the process may run on (default `os.availableParallelism()`). */
  readonly cpus?: number | undefined
}

const OPERATOR_GROWTH = /^--heap[-_]growing[-_]percent(=|$)/
/** V8 spells a negation `--no`, `--no-` or `--no_`; Node refuses these flags in NODE_OPTIONS. */
const OPERATOR_SCAVENGE = /^--(no[-_]?)?(parallel[-_]scavenge|single[-_]threaded[-_]gc)(=|$)/

/** Whether the growth should be tight now, given whether it is and how many requests are open. */
export const shouldTighten = (tight: boolean, open: number, tightAt: number): boolean =>
  tightAt > 0 && (tight ? open >= Math.ceil(tightAt / 2) : open >= tightAt)

const growthFlag = (tight: boolean) => `--heap-growing-percent=${tight ? TIGHT_GROWTH_PERCENT : 0}`
const scavengeFlag = (tight: boolean) => (tight ? "--parallel-scavenge" : "--no-parallel-scavenge")

/**
 * Sets the levers for few requests open at once, then reads `open()` every
 * `intervalMillis` for as long as the scope is open and sets them when the
 * count crosses the threshold; V8's own choices once the scope closes.
 */
export const watch = (
  open: () => number,
  options: HeapPolicyOptions,
): Effect.Effect<void, never, Scope.Scope> => {
  const execArgv = options.execArgv ?? process.execArgv
  const growth = options.tightAt > 0 && !execArgv.some((arg) => OPERATOR_GROWTH.test(arg))
  const scavenge =
    (options.cpus ?? availableParallelism()) === 1 && !execArgv.some((arg) => OPERATOR_SCAVENGE.test(arg))
  if (!growth && !scavenge) return Effect.void
  const setFlags = options.setFlags ?? setFlagsFromString
  let tight = false
  const check = Effect.sync(() => {
    const next = shouldTighten(tight, open(), options.tightAt)
    if (next === tight) return
    tight = next
    if (growth) setFlags(growthFlag(tight))
    if (scavenge) setFlags(scavengeFlag(tight))
  })
  return Effect.gen(function* () {
    if (scavenge) setFlags(scavengeFlag(false))
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        if (growth && tight) setFlags(growthFlag(false))
        if (scavenge) setFlags(scavengeFlag(true))
        tight = false
      }),
    )
    if (options.tightAt > 0)
      yield* Effect.forkScoped(Effect.repeat(check, Schedule.spaced(options.intervalMillis ?? 1_000)))
  })
}
