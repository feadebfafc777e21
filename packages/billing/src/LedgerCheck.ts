/**
 * Proves the ledger consistent (`swarmgate ledger check`): every account's
 * balance equals its credits minus its charges, every usage record has exactly
 * one charge of the same amount and every charge a usage record, no request is
 * charged twice, and no balance or cost is negative.
 */
import { SqlClient, type SqlError } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Effect } from "effect"

const toNumber = Database.toNumber

export type Problem =
  | {
      readonly kind: "balance_drift"
      readonly account_id: string
      readonly balance_micros: number
      readonly credits_micros: number
      readonly charges_micros: number
    }
  | { readonly kind: "negative_balance"; readonly account_id: string; readonly balance_micros: number }
  | { readonly kind: "usage_without_charge"; readonly request_id: string }
  | {
      readonly kind: "charge_mismatch"
      readonly request_id: string
      readonly cost_micros: number
      readonly charge_micros: number
    }
  | { readonly kind: "charge_without_usage"; readonly request_id: string | null }
  | { readonly kind: "charged_twice"; readonly request_id: string; readonly charges: number }
  | { readonly kind: "negative_cost"; readonly request_id: string }
  | { readonly kind: "unknown_movement"; readonly movement_id: string; readonly movement_kind: string }

export interface LedgerReport {
  readonly ok: boolean
  readonly accounts: number
  readonly usage_records: number
  readonly credits_micros: number
  readonly charges_micros: number
  readonly usage_cost_micros: number
  readonly balances_micros: number
  /** At most `MAX_PROBLEMS` of them. */
  readonly problems: ReadonlyArray<Problem>
}

export const MAX_PROBLEMS = 100

type Num = number | string

export const check: Effect.Effect<LedgerReport, SqlError.SqlError, SqlClient.SqlClient> = Effect.gen(
  function* () {
    const sql = yield* SqlClient.SqlClient
    const problems: Array<Problem> = []
    const add = (problem: Problem) => {
      if (problems.length < MAX_PROBLEMS) problems.push(problem)
    }

    // One snapshot, so a group commit landing mid-check cannot look like drift.
    return yield* sql.withTransaction(
      Effect.gen(function* () {
        yield* sql.onDialectOrElse({
          pg: () => sql`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`,
          orElse: () => Effect.void,
        })
        const accounts = yield* sql<{ id: string; balance_micros: Num; credits: Num; charges: Num }>`
          SELECT a.id, a.balance_micros,
            COALESCE((SELECT SUM(m.amount_micros) FROM balance_movements m
                      WHERE m.account_id = a.id AND m.kind = 'credit'), 0) AS credits,
            COALESCE((SELECT SUM(m.amount_micros) FROM balance_movements m
                      WHERE m.account_id = a.id AND m.kind = 'charge'), 0) AS charges
          FROM accounts a ORDER BY a.id`
        let credits = 0
        let charges = 0
        let balances = 0
        for (const row of accounts) {
          const balance = toNumber(row.balance_micros)
          const c = toNumber(row.credits)
          const d = toNumber(row.charges)
          credits += c
          charges += d
          balances += balance
          if (balance !== c - d) {
            add({
              kind: "balance_drift",
              account_id: row.id,
              balance_micros: balance,
              credits_micros: c,
              charges_micros: d,
            })
          }
          if (balance < 0) add({ kind: "negative_balance", account_id: row.id, balance_micros: balance })
        }

        const unknown = yield* sql<{ id: string; kind: string }>`
          SELECT id, kind FROM balance_movements WHERE kind NOT IN ('credit', 'charge') ORDER BY id`
        for (const row of unknown)
          add({ kind: "unknown_movement", movement_id: row.id, movement_kind: row.kind })

        const twice = yield* sql<{ request_id: string; n: Num }>`
          SELECT request_id, COUNT(*) AS n FROM balance_movements
          WHERE kind = 'charge' GROUP BY request_id HAVING COUNT(*) > 1 ORDER BY request_id`
        for (const row of twice)
          add({ kind: "charged_twice", request_id: row.request_id, charges: toNumber(row.n) })

        const unmatched = yield* sql<{ request_id: string; cost_micros: Num; amount_micros: Num | null }>`
          SELECT u.request_id, u.cost_micros, m.amount_micros FROM usage_records u
          LEFT JOIN balance_movements m ON m.request_id = u.request_id AND m.kind = 'charge'
          WHERE m.id IS NULL OR m.amount_micros <> u.cost_micros OR m.account_id <> u.account_id
          ORDER BY u.request_id`
        for (const row of unmatched) {
          if (row.amount_micros === null) add({ kind: "usage_without_charge", request_id: row.request_id })
          else
            add({
              kind: "charge_mismatch",
              request_id: row.request_id,
              cost_micros: toNumber(row.cost_micros),
              charge_micros: toNumber(row.amount_micros),
            })
        }

        const orphans = yield* sql<{ request_id: string | null }>`
          SELECT m.request_id FROM balance_movements m
          LEFT JOIN usage_records u ON u.request_id = m.request_id
          WHERE m.kind = 'charge' AND u.request_id IS NULL ORDER BY m.request_id`
        for (const row of orphans) add({ kind: "charge_without_usage", request_id: row.request_id })

        const negative = yield* sql<{ request_id: string }>`
          SELECT request_id FROM usage_records WHERE cost_micros < 0 ORDER BY request_id`
        for (const row of negative) add({ kind: "negative_cost", request_id: row.request_id })

        const usage = yield* sql<{ n: Num; cost: Num | null }>`
          SELECT COUNT(*) AS n, SUM(cost_micros) AS cost FROM usage_records`
        const usageCost = toNumber(usage[0]?.cost ?? 0)

        return {
          ok: problems.length === 0 && usageCost === charges,
          accounts: accounts.length,
          usage_records: toNumber(usage[0]?.n ?? 0),
          credits_micros: credits,
          charges_micros: charges,
          usage_cost_micros: usageCost,
          balances_micros: balances,
          problems,
        }
      }),
    )
  },
)
