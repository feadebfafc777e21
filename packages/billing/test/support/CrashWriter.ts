/**
 * The process the crash test kills: billing on `DATABASE_URL`, reserving and
 * settling as fast as it can for the account and key given, with the ledger
 * written behind in batches. It prints `settled <n> written <m>` as it goes
 * (m: the ledger's rows it reads back); the test SIGKILLs it in the middle of
 * that, batches in flight.
 *
 *   tsx CrashWriter.ts <database-url> <account-id> <key-id>
 */
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Effect, Layer } from "effect"
import * as Billing from "../../src/Billing"
import { PRICES } from "./Fixtures"

const [url, accountId, keyId] = process.argv.slice(2)
if (url === undefined || accountId === undefined || keyId === undefined) {
  console.error("usage: CrashWriter.ts <database-url> <account-id> <key-id>")
  process.exit(2)
}

const program = Effect.gen(function* () {
  const billing = yield* Billing.Billing
  const sql = yield* SqlClient.SqlClient
  let settled = 0
  while (true) {
    // A burst of settlements between two batch windows, so a kill lands with charges queued and written.
    for (let i = 0; i < 20; i++) {
      const requestId = `req_crash_${process.pid}_${settled}`
      yield* billing.reserve({
        requestId,
        accountId,
        keyId,
        model: "m",
        promptTokens: 10,
        maxTokens: 20,
        paymentHold: false,
        monthlySpendLimitMicros: null,
        keySpendLimitMicros: null,
        ttlMillis: 60_000,
      })
      yield* billing.settle(requestId, { completionTokens: 1 + (settled % 20), outcome: "completed" })
      settled++
    }
    const rows = yield* sql<{ n: unknown }>`SELECT COUNT(*) AS n FROM usage_records`
    process.stdout.write(`settled ${settled} written ${Database.toNumber(rows[0]!.n)}\n`)
    yield* Effect.sleep(2)
  }
})

const layer = Billing.layer({ prices: PRICES, flushMillis: 5, batchMax: 37 }).pipe(
  Layer.provideMerge(Database.layer(url)),
)

Effect.runPromise(Effect.provide(program, layer)).catch((error) => {
  console.error(error)
  process.exit(1)
})
