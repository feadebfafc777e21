/**
 * The ledger's group commit on its own: one batch across several accounts
 * (a SQLite file's writer thread, 32 rows per run and the rest row by row; SQLite's own connection one JSON
 * parameter read back by `json_each`, also when the thread cannot start;
 * PostgreSQL multi-row INSERTs), and a batch that cannot be written leaves nothing.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, layer } from "@effect/vitest"
import { Database, SqliteWriter, TestDatabase } from "@swarmgate/store"
import { Effect, Either, Layer } from "effect"
import * as LedgerWriter from "../src/internal/LedgerWriter"
import * as Ledger from "../src/Ledger"
import * as LedgerCheck from "../src/LedgerCheck"
import { hex, ledgerOf, type Seeded, seed } from "./support/Fixtures"

const entry = (
  account: Seeded,
  cost: number,
  overrides: Partial<Ledger.UsageEntry> = {},
): Ledger.UsageEntry => ({
  requestId: `req_${hex()}`,
  accountId: account.accountId,
  keyId: account.keyId,
  model: "m",
  promptTokens: 10,
  completionTokens: 20,
  costMicros: cost,
  holdMicros: cost * 2,
  outcome: "completed",
  startedAt: 1_700_000_000_000,
  createdAt: 1_700_000_000_500,
  ...overrides,
})

const byRequest = <A extends { readonly requestId: string }>(rows: ReadonlyArray<A>) =>
  [...rows].sort((a, b) => a.requestId.localeCompare(b.requestId))

const suite = (name: string, database: Layer.Layer<SqlClient.SqlClient, unknown>) =>
  layer(database, { timeout: "120 seconds" })(name, (it) => {
    it.effect(
      "a batch over several accounts writes every usage row and charge and moves each balance once",
      () =>
        Effect.gen(function* () {
          const a = yield* seed(1_000_000)
          const b = yield* seed(500_000)
          // Odd sizes and text that JSON must escape: nothing depends on chunk sizes or plain ids.
          const batch = [
            entry(a, 1_000),
            entry(b, 2_500, { outcome: "client_disconnected", completionTokens: 3 }),
            ...Array.from({ length: 37 }, (_, i) => entry(a, 100 + i)),
            entry(b, 7, { model: 'm "quoted" \\ model', promptTokens: 0, completionTokens: 0 }),
          ]
          yield* Ledger.writeBatch(batch)

          const spentA = batch
            .filter((e) => e.accountId === a.accountId)
            .reduce((n, e) => n + e.costMicros, 0)
          const spentB = batch
            .filter((e) => e.accountId === b.accountId)
            .reduce((n, e) => n + e.costMicros, 0)
          const ledgerA = yield* ledgerOf(a.accountId)
          const ledgerB = yield* ledgerOf(b.accountId)
          expect(ledgerA.balance).toBe(1_000_000 - spentA)
          expect(ledgerB.balance).toBe(500_000 - spentB)
          for (const [account, ledger] of [
            [a, ledgerA],
            [b, ledgerB],
          ] as const) {
            const expected = byRequest(batch.filter((e) => e.accountId === account.accountId))
            expect(ledger.usage).toEqual(
              expected.map((e) => ({
                requestId: e.requestId,
                keyId: e.keyId,
                promptTokens: e.promptTokens,
                completionTokens: e.completionTokens,
                cost: e.costMicros,
                outcome: e.outcome,
              })),
            )
            expect(ledger.charges).toEqual(
              expected.map((e) => ({ requestId: e.requestId, amount: e.costMicros })),
            )
          }
          // Each charge's id is `chargeId` of its request: what makes a batch written twice fail.
          const sql = yield* SqlClient.SqlClient
          const ids = yield* sql<{
            id: string
            request_id: string
          }>`SELECT id, request_id FROM balance_movements
            WHERE kind = 'charge' AND account_id IN (${a.accountId}, ${b.accountId})`
          expect(ids).toHaveLength(batch.length)
          for (const row of ids) expect(row.id).toBe(Ledger.chargeId(row.request_id))
          const report = yield* LedgerCheck.check
          expect(report.problems).toEqual([])
        }),
    )

    it.effect("a batch holding a request id already written fails as a whole and changes nothing", () =>
      Effect.gen(function* () {
        const a = yield* seed(1_000_000)
        const first = entry(a, 300)
        yield* Ledger.writeBatch([first])
        const before = yield* ledgerOf(a.accountId)
        const result = yield* Effect.either(Ledger.writeBatch([entry(a, 50), first, entry(a, 70)]))
        expect(Either.isLeft(result)).toBe(true)
        expect(yield* ledgerOf(a.accountId)).toEqual(before)
        // The one-by-one fallback the writer uses then: the known entry is skipped, the others land.
        const fresh = entry(a, 50)
        expect(yield* Ledger.writeOne(first)).toBe(false)
        expect(yield* Ledger.writeOne(fresh)).toBe(true)
        expect((yield* ledgerOf(a.accountId)).balance).toBe(1_000_000 - 300 - 50)
      }),
    )
  })

suite("Ledger on SQLite", Database.layer("sqlite::memory:"))

// @effect/sql reports a COMMIT or ROLLBACK on a lost connection as a defect: the book's writer
// must see a failed batch (and write it row by row), not die with it and stop writing for good.
layer(Database.layer("sqlite::memory:"))("the ledger writer when a batch dies", (it) => {
  it.effect("writes the batch row by row, each entry once, and reports every entry written", () =>
    Effect.gen(function* () {
      const a = yield* seed(1_000_000)
      const already = entry(a, 300)
      yield* Ledger.writeOne(already)
      const batch = [entry(a, 50), already, entry(a, 70)]
      const dying: SqliteWriter.SqliteWriterShape = {
        transaction: () => Effect.die(new Error("connection lost at COMMIT")),
      }
      const outcome = yield* LedgerWriter.write(batch).pipe(
        Effect.provideService(SqliteWriter.SqliteWriter, dying),
      )
      expect(outcome.failed).toEqual([])
      expect(outcome.written.map((e) => e.requestId)).toEqual(batch.map((e) => e.requestId))
      expect((yield* ledgerOf(a.accountId)).balance).toBe(1_000_000 - 300 - 50 - 70)
      expect((yield* LedgerCheck.check).problems).toEqual([])
    }),
  )
})
// A file: the ledger's batches are written by its writer thread (SqliteWriter).
suite("Ledger on a SQLite file", TestDatabase.layerSqliteFile("swarmgate_ledger_file"))
// A writer thread that cannot open its file: each batch is one transaction on the main connection.
suite(
  "Ledger on a SQLite file whose writer thread cannot start",
  Layer.merge(
    TestDatabase.layerSqliteFile("swarmgate_ledger_nothread"),
    SqliteWriter.layer("/nonexistent-swarmgate-dir/ledger.db"),
  ),
)

TestDatabase.describePg(describe, "Ledger on PostgreSQL", () => {
  suite("a fresh database", TestDatabase.layerPg("swarmgate_ledger"))
})
