/**
 * A book's background loops (ledger writer, hold sweep, lease renewal) run
 * for the life of the book: a loop that died would leave charges unwritten,
 * or lapsed holds' money held, for good, and a forked fiber's death is
 * silent. So each round's defect is logged and the loop goes on.
 */
import { Cause, Effect, type Scope } from "effect"

/** `round` over and over on a fiber of the scope's; `name` says which loop in a defect's log line. */
export const fork = (name: string, round: Effect.Effect<void>): Effect.Effect<void, never, Scope.Scope> =>
  Effect.asVoid(
    Effect.forkScoped(
      Effect.forever(
        Effect.catchAllCause(round, (cause) =>
          Cause.isInterruptedOnly(cause)
            ? Effect.failCause(cause)
            : Effect.logError(`billing: ${name} failed; it goes on`, cause),
        ),
      ),
    ),
  )
