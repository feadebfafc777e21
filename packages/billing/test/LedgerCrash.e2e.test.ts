/**
 * Batched ledger writes survive a crash: a process settling charges as fast as
 * it can, with batches in flight, is SIGKILLed; the ledger it leaves passes
 * the ledger check (every batch whole or absent, nothing charged twice, every
 * balance = credits − charges), holds what was settled up to the last window,
 * and a new instance rebuilds its book from it and goes on charging.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Database, TestDatabase } from "@swarmgate/store"
import { Effect, Layer, type Scope } from "effect"
import * as Billing from "../src/Billing"
import * as LedgerCheck from "../src/LedgerCheck"
import { PRICES, request, seed } from "./support/Fixtures"

const WRITER = fileURLToPath(new URL("./support/CrashWriter.ts", import.meta.url))
const BALANCE = 1_000_000_000_000

/** What the writer last printed: charges settled, and the ledger's rows it read back after them. */
interface Progress {
  readonly settled: number
  readonly written: number
}

/**
 * Runs the writer until it has settled at least `atLeast` charges and read
 * some of them back from the ledger, then kills it; returns what it last
 * printed. Waiting for a written row (not a time) keeps the kill in the middle
 * of batched writes however slow the machine is: the writer thread may take a
 * while to start.
 */
const runAndKill = (url: string, accountId: string, keyId: string, atLeast: number) =>
  Effect.async<Progress, Error>((resume) => {
    const child: ChildProcess = spawn(process.execPath, ["--import", "tsx", WRITER, url, accountId, keyId], {
      stdio: ["ignore", "pipe", "pipe"],
    })
    let progress: Progress = { settled: 0, written: 0 }
    let output = ""
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      resume(
        Effect.fail(
          new Error(`the writer settled only ${progress.settled} in time:\n${output.slice(-2000)}`),
        ),
      )
    }, 60_000)
    child.stdout?.on("data", (data: Buffer) => {
      output += data.toString()
      for (const match of data.toString().matchAll(/settled (\d+) written (\d+)/g))
        progress = { settled: Number(match[1]), written: Number(match[2]) }
      if (progress.settled >= atLeast && progress.written > 0 && child.exitCode === null && !child.killed) {
        // Mid-stream: the writer is settling and its ledger batches are being written.
        child.kill("SIGKILL")
      }
    })
    child.stderr?.on("data", (data: Buffer) => {
      output += data.toString()
    })
    child.once("exit", (_, signal) => {
      clearTimeout(timer)
      if (signal === "SIGKILL") resume(Effect.succeed(progress))
      else resume(Effect.fail(new Error(`the writer exited by itself:\n${output.slice(-2000)}`)))
    })
    return Effect.sync(() => child.kill("SIGKILL"))
  })

const crashAndCheck = (database: Effect.Effect<string, unknown, Scope.Scope>) =>
  Effect.scoped(
    Effect.gen(function* () {
      const url = yield* database
      const seeded = yield* Effect.scoped(
        Effect.provide(seed(BALANCE), Layer.fresh(Database.layer(url)) as Layer.Layer<SqlClient.SqlClient>),
      )
      const printed = yield* runAndKill(url, seeded.accountId, seeded.keyId, 600)

      const after = Effect.gen(function* () {
        const report = yield* LedgerCheck.check
        expect(report.problems).toEqual([])
        expect(report.ok).toBe(true)
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ n: unknown }>`SELECT COUNT(*) AS n FROM usage_records`
        return Database.toNumber(rows[0]!.n)
      })
      const sqlLayer = Layer.fresh(Database.layer(url)) as Layer.Layer<SqlClient.SqlClient>
      const written = yield* Effect.scoped(Effect.provide(after, sqlLayer))
      // What the writer read back from the ledger survived the kill, and nothing beyond what was settled
      // (20 per printed line). How far the ledger lagged behind at the kill depends on the database's
      // speed: the charges of the last batch windows are lost (under-charged, never over-charged: README,
      // Billing).
      expect(written).toBeGreaterThanOrEqual(printed.written)
      expect(written).toBeLessThanOrEqual(printed.settled + 20)

      // A new instance rebuilds its book from that ledger and charges on from there, exactly.
      yield* Effect.scoped(
        Effect.provide(
          Effect.gen(function* () {
            const billing = yield* Billing.Billing
            const before = (yield* billing.accountMoney([seeded.accountId])).get(seeded.accountId)!
            const hold = yield* billing.reserve(request(seeded))
            yield* billing.settle(hold.requestId, { completionTokens: 5, outcome: "completed" })
            yield* billing.flush
            const now = (yield* billing.accountMoney([seeded.accountId])).get(seeded.accountId)!
            expect(before.availableMicros - now.availableMicros).toBe(10 * 100 + 5 * 200)
            const report = yield* LedgerCheck.check
            expect(report.problems).toEqual([])
            expect(report.usage_records).toBe(written + 1)
          }),
          Layer.provideMerge(Billing.layer({ prices: PRICES }), sqlLayer),
        ),
      )
    }),
  )

describe("a crash in the middle of batched ledger writes", () => {
  it.live(
    "SQLite: the ledger check passes and a new instance charges on exactly",
    () => crashAndCheck(TestDatabase.withTemporarySqliteFile("ledger-crash")),
    { timeout: 120_000 },
  )
})

TestDatabase.describePg(describe, "a crash in the middle of batched ledger writes, PostgreSQL", () => {
  it.live(
    "PostgreSQL: the ledger check passes and a new instance charges on exactly",
    () => crashAndCheck(TestDatabase.withTemporaryPgDatabase("ledger_crash")),
    { timeout: 120_000 },
  )
})
