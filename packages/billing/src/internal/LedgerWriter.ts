/**
 * The ledger-writing half shared by both books (`Billing.ts` in memory,
 * `RedisBilling.ts` in Redis): how a settled hold becomes a usage record, and
 * how a batch of them reaches SQL. What a book does with the outcome (mark the
 * charges written, acknowledge or give back a claim, queue again) stays with
 * the book.
 */
import { SqlClient } from "@effect/sql"
import { SqliteWriter } from "@swarmgate/store"
import { Cause, Effect, Exit } from "effect"
import * as Ledger from "../Ledger"
import type { Hold } from "./Book"

/**
 * What a book runs its SQL with: the client and, for a SQLite file, its
 * writer thread, as found when the book is made — the book's own fibers and
 * its callers' need not carry them.
 */
export const captureSql = Effect.map(
  Effect.all([SqlClient.SqlClient, SqliteWriter.SqliteWriter]),
  ([sql, writer]) =>
    <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, Exclude<R, SqlClient.SqlClient>> =>
      effect.pipe(
        Effect.provideService(SqlClient.SqlClient, sql),
        Effect.provideService(SqliteWriter.SqliteWriter, writer),
      ),
)

/** The usage record of a settled hold; `chargedMicros` is already capped at the hold. */
export const usageEntry = (
  hold: Hold,
  settlement: Pick<Ledger.UsageEntry, "completionTokens" | "outcome">,
  chargedMicros: number,
  now: number,
): Ledger.UsageEntry => ({
  requestId: hold.requestId,
  accountId: hold.accountId,
  keyId: hold.keyId,
  model: hold.model,
  promptTokens: hold.promptTokens,
  completionTokens: settlement.completionTokens,
  costMicros: chargedMicros,
  holdMicros: hold.amountMicros,
  outcome: settlement.outcome,
  startedAt: hold.createdAt,
  createdAt: now,
})

export interface WriteOutcome {
  /** In the ledger now, or already there (a batch that committed but whose answer was lost). */
  readonly written: ReadonlyArray<Ledger.UsageEntry>
  /** Not written; the book must keep them for a later attempt. */
  readonly failed: ReadonlyArray<Ledger.UsageEntry>
  /** Why the last of `failed` failed. */
  readonly cause: unknown
}

/**
 * Writes a batch in one transaction (group commit). When that fails, writes
 * the entries one by one, so one bad entry (e.g. one already written) does not
 * block the others; each is written at most once, the request id being the
 * ledger's primary key. Never fails and never dies: the outcome says what was
 * written. A defect counts as a failed write too — @effect/sql reports a
 * COMMIT or ROLLBACK on a lost connection as one, and a book's writer loop
 * must not end on it (the batch may have committed: the row-by-row retry
 * finds its request ids written and counts them as written).
 */
export const write = (
  batch: ReadonlyArray<Ledger.UsageEntry>,
): Effect.Effect<WriteOutcome, never, SqlClient.SqlClient> => Effect.gen(() => writeBody(batch))

// Declared once: a generator function made per call (`Effect.gen(function* () { … })` inside
// `write`) made V8 build a new prototype at every flush (docs/ARCHITECTURE.md).
function* writeBody(batch: ReadonlyArray<Ledger.UsageEntry>) {
  const batched = yield* Effect.exit(Ledger.writeBatch(batch))
  if (Exit.isSuccess(batched)) return { written: batch, failed: [], cause: undefined }
  const written: Array<Ledger.UsageEntry> = []
  const failed: Array<Ledger.UsageEntry> = []
  let cause: unknown
  for (const entry of batch) {
    const one = yield* Effect.exit(Ledger.writeOne(entry))
    if (Exit.isSuccess(one)) written.push(entry)
    else {
      failed.push(entry)
      cause = Cause.squash(one.cause)
    }
  }
  return { written, failed, cause }
}

/** The `reason` of the `BillingUnavailable` a book fails with when some charges were not written. */
export const failedReason = (outcome: WriteOutcome) =>
  `${outcome.failed.length} charge(s) could not be written`
