/**
 * Accounts and keys written straight into the ledger tables (billing does not
 * depend on `@swarmgate/auth`), and reads of what the ledger holds.
 */
import { randomBytes } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Clock, Effect } from "effect"
import type { ReserveInput } from "../../src/Billing"
import type { PriceTable } from "../../src/Prices"

const toNumber = Database.toNumber

/** 100 µ$ per prompt token, 200 µ$ per completion token: easy arithmetic. */
export const PRICES: PriceTable = new Map([
  ["m", { promptMicrosPerMillion: 100_000_000, completionMicrosPerMillion: 200_000_000 }],
])

export const hex = () => randomBytes(8).toString("hex")

export interface Seeded {
  readonly accountId: string
  readonly keyId: string
}

/** An account with an opening credit of `balance` and one key. */
export const seed = (balance: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const accountId = `acct_${hex()}`
    const keyId = `key_${hex()}`
    yield* sql`INSERT INTO accounts ${sql.insert({
      id: accountId,
      name: "test",
      status: "active",
      payment_hold: 0,
      balance_micros: 0,
      monthly_spend_limit_micros: null,
      limits: "{}",
      created_at: now,
      updated_at: now,
    })}`
    if (balance > 0) yield* creditInSql(accountId, balance)
    yield* addKey(accountId, keyId)
    return { accountId, keyId } satisfies Seeded
  })

export const addKey = (accountId: string, keyId = `key_${hex()}`) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    yield* sql`INSERT INTO api_keys ${sql.insert({
      id: keyId,
      account_id: accountId,
      key_hash: hex() + hex(),
      prefix: "sk-swarm-tst",
      name: null,
      disabled: 0,
      revoked_at: null,
      expires_at: null,
      spend_limit_micros: null,
      created_at: now,
      updated_at: now,
    })}`
    return keyId
  })

/** A credit as `Repository.addCredit` (the CLI) makes it: balance and movement in one transaction. */
export const creditInSql = (accountId: string, amount: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    yield* sql.withTransaction(
      Effect.gen(function* () {
        yield* sql`UPDATE accounts SET balance_micros = balance_micros + ${amount} WHERE id = ${accountId}`
        yield* sql`INSERT INTO balance_movements ${sql.insert({
          id: `mov_${hex()}`,
          account_id: accountId,
          kind: "credit",
          amount_micros: amount,
          request_id: null,
          created_at: now,
        })}`
      }),
    )
  })

export const request = (seeded: Seeded, overrides: Partial<ReserveInput> = {}): ReserveInput => ({
  requestId: `req_${hex()}`,
  accountId: seeded.accountId,
  keyId: seeded.keyId,
  model: "m",
  promptTokens: 10,
  maxTokens: 50,
  paymentHold: false,
  monthlySpendLimitMicros: null,
  keySpendLimitMicros: null,
  ttlMillis: 60_000,
  ...overrides,
})

/** What the ledger says about an account. */
export const ledgerOf = (accountId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [account] = yield* sql<{ balance_micros: unknown }>`
      SELECT balance_micros FROM accounts WHERE id = ${accountId}`
    const usage = yield* sql<{
      request_id: string
      key_id: string
      prompt_tokens: unknown
      completion_tokens: unknown
      cost_micros: unknown
      outcome: string
    }>`SELECT request_id, key_id, prompt_tokens, completion_tokens, cost_micros, outcome
       FROM usage_records WHERE account_id = ${accountId} ORDER BY request_id`
    const charges = yield* sql<{ request_id: string; amount_micros: unknown }>`
      SELECT request_id, amount_micros FROM balance_movements
      WHERE account_id = ${accountId} AND kind = 'charge' ORDER BY request_id`
    return {
      balance: toNumber(account!.balance_micros),
      usage: usage.map((u) => ({
        requestId: u.request_id,
        keyId: u.key_id,
        promptTokens: toNumber(u.prompt_tokens),
        completionTokens: toNumber(u.completion_tokens),
        cost: toNumber(u.cost_micros),
        outcome: u.outcome,
      })),
      charges: charges.map((c) => ({ requestId: c.request_id, amount: toNumber(c.amount_micros) })),
    }
  })

/** Waits in real time (the test's clock may be a TestClock) until `check` holds. */
export const eventually = <E, R>(check: Effect.Effect<boolean, E, R>, millis = 5_000) =>
  Effect.gen(function* () {
    const deadline = Date.now() + millis
    while (!(yield* check)) {
      if (Date.now() > deadline) return yield* Effect.die(new Error("condition not met in time"))
      yield* Effect.promise(() => new Promise((r) => setTimeout(r, 5)))
    }
  })
