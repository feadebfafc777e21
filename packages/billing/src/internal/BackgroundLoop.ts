/**
 * A book's background loops (ledger writer, hold sweep, lease renewal) run
 * for the life of the book: a loop that died would leave charges unwritten,
 * or lapsed holds' money held, for good, and a forked fiber's death is
 * silent. So each round's defect is logged and the loop goes on, a second
 * later (a defect that recurs every round logs once a second, not in a spin).
 */
import { Cause, Effect, type Scope } from "effect"

const AFTER_DEFECT_MILLIS = 1_000

/** `round` over and over on a fiber of the scope's; `name` says which loop in a defect's log line. */
export const fork = (name: string, round: Effect.Effect<void>): Effect.Effect<void, never, Scope.Scope> =>
  Effect.asVoid(
    Effect.forkScoped(
      Effect.forever(
        Effect.catchAllCause(round, (cause) =>
          Cause.isInterruptedOnly(cause)
            ? Effect.failCause(cause)
            : Effect.zipRight(
                Effect.logError(`billing: ${name} failed; it goes on`, cause),
                Effect.sleep(AFTER_DEFECT_MILLIS),
              ),
        ),
      ),
    ),
  )
