/**
 * How far V8 lets the old generation grow between major collections, chosen
 * by how many requests are open (streams, and anything else in flight).
 *
 * A stream lives for seconds, so its objects outlast the young generation
 * and die in the old one, where they stay until a major collection. V8 lets
 * the old generation grow to 1.5–4× what the last one left before it starts
 * the next: at 2,000 open streams that growth, not the streams' own ~40 KB
 * each, is most of the resident set. A fixed, tighter growth
 * (`--heap-growing-percent`) keeps it near the goal, and costs no CPU per
 * streamed token measurable at that scale; but at a few dozen short JSON
 * requests it makes major collections frequent for a small live set and
 * costs ~25 % CPU per request (BENCHMARKS.md, 2026-11-27 and 2026-11-28). So
 * the growth is tight only while many requests are open, and V8's own
 * otherwise. V8 reads the flag when it sizes the heap after each major
 * collection, so setting it at run time takes effect at the next one.
 */
import { setFlagsFromString } from "node:v8"
import { Effect, Schedule, type Scope } from "effect"

/** The old generation may grow to 1.3× what the last major collection left. */
export const TIGHT_GROWTH_PERCENT = 30

export interface HeapPolicyOptions {
  /** Open requests from which the growth is tight (0: never); V8's own again below half. */
  readonly tightAt: number
  /** How often the count is read. */
  readonly intervalMillis?: number | undefined
  /** Sets V8 flags; tests pass their own. */
  readonly setFlags?: ((flags: string) => void) | undefined
  /** Node's command-line options (default `process.execArgv`): an operator's own growth there wins. */
  readonly execArgv?: ReadonlyArray<string> | undefined
}

const OPERATOR_GROWTH = /^--heap[-_]growing[-_]percent(=|$)/

/** Whether the growth should be tight now, given whether it is and how many requests are open. */
export const shouldTighten = (tight: boolean, open: number, tightAt: number): boolean =>
  tightAt > 0 && (tight ? open >= Math.ceil(tightAt / 2) : open >= tightAt)

const flags = (tight: boolean) => `--heap-growing-percent=${tight ? TIGHT_GROWTH_PERCENT : 0}`

/**
 * Reads `open()` every `intervalMillis` for as long as the scope is open and
 * sets the growth when it should change; V8's own growth once the scope closes.
 */
export const watch = (
  open: () => number,
  options: HeapPolicyOptions,
): Effect.Effect<void, never, Scope.Scope> => {
  if (options.tightAt <= 0) return Effect.void
  if ((options.execArgv ?? process.execArgv).some((arg) => OPERATOR_GROWTH.test(arg))) return Effect.void
  const setFlags = options.setFlags ?? setFlagsFromString
  let tight = false
  const check = Effect.sync(() => {
    const next = shouldTighten(tight, open(), options.tightAt)
    if (next === tight) return
    tight = next
    setFlags(flags(tight))
  })
  return Effect.gen(function* () {
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        if (tight) setFlags(flags(false))
        tight = false
      }),
    )
    yield* Effect.forkScoped(Effect.repeat(check, Schedule.spaced(options.intervalMillis ?? 1_000)))
  })
}
