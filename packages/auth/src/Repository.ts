/**
 * SQL access to accounts and keys (both SQLite and PostgreSQL). Creation of
 * keys returns the secret once; only its SHA-256 hash is stored.
 */
import { randomUUID } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Clock, Context, Data, Effect, Layer, Option } from "effect"
import type { Account, AccountId, AccountLimits, AccountStatus, ApiKey, KeyId } from "./Domain"
import { generateKey } from "./KeyFormat"

const toNumber = Database.toNumber

export class NotFound extends Data.TaggedError("NotFound")<{
  readonly entity: "account" | "key"
  readonly id: string
}> {}
/** Storage failures are not the caller's fault: the boundary maps this to a 500/503. */
export class RepositoryUnavailable extends Data.TaggedError("RepositoryUnavailable")<{
  readonly cause: unknown
}> {}

interface AccountRow {
  readonly id: string
  readonly name: string
  readonly status: string
  readonly payment_hold: number | boolean
  readonly balance_micros: number | string
  readonly monthly_spend_limit_micros: number | string | null
  readonly limits: string
  readonly created_at: number | string
  readonly email: string | null
  readonly email_verified: number | boolean
  readonly closed_at: number | string | null
}

interface KeyRow {
  readonly id: string
  readonly account_id: string
  readonly prefix: string
  readonly name: string | null
  readonly disabled: number | boolean
  readonly revoked_at: number | string | null
  readonly expires_at: number | string | null
  readonly spend_limit_micros: number | string | null
  readonly created_at: number | string
}

const nullableNumber = (v: number | string | null): number | null => (v === null ? null : toNumber(v))

const toAccount = (row: AccountRow): Account => ({
  id: row.id as AccountId,
  name: row.name,
  status: row.status as AccountStatus,
  paymentHold: Boolean(toNumber(row.payment_hold)),
  balanceMicros: toNumber(row.balance_micros),
  monthlySpendLimitMicros: nullableNumber(row.monthly_spend_limit_micros),
  limits: JSON.parse(row.limits) as AccountLimits,
  createdAt: toNumber(row.created_at),
  email: row.email,
  emailVerified: Boolean(toNumber(row.email_verified)),
  closedAt: nullableNumber(row.closed_at),
})

const toKey = (row: KeyRow): ApiKey => ({
  id: row.id as KeyId,
  accountId: row.account_id as AccountId,
  prefix: row.prefix,
  name: row.name,
  disabled: Boolean(toNumber(row.disabled)),
  revokedAt: nullableNumber(row.revoked_at),
  expiresAt: nullableNumber(row.expires_at),
  spendLimitMicros: nullableNumber(row.spend_limit_micros),
  createdAt: toNumber(row.created_at),
})

export interface NewAccount {
  readonly name: string
  readonly balanceMicros?: number | undefined
  readonly monthlySpendLimitMicros?: number | null | undefined
  readonly limits?: AccountLimits | undefined
  readonly status?: AccountStatus | undefined
  readonly email?: string | null | undefined
  readonly emailVerified?: boolean | undefined
}

export interface AccountPatch {
  readonly status?: AccountStatus | undefined
  readonly email?: string | undefined
  readonly emailVerified?: boolean | undefined
  readonly paymentHold?: boolean | undefined
  readonly monthlySpendLimitMicros?: number | null | undefined
  readonly limits?: AccountLimits | undefined
}

export interface NewKey {
  readonly name?: string | null | undefined
  readonly spendLimitMicros?: number | null | undefined
  readonly expiresAt?: number | null | undefined
}

export interface KeyPatch {
  readonly disabled?: boolean | undefined
  readonly spendLimitMicros?: number | null | undefined
}

export interface CreatedKey {
  readonly key: ApiKey
  /** The secret, shown once. */
  readonly secret: string
}

type Fx<A, E = never> = Effect.Effect<A, E | RepositoryUnavailable>

export interface RepositoryShape {
  readonly createAccount: (input: NewAccount) => Fx<Account>
  readonly getAccount: (id: string) => Fx<Account, NotFound>
  readonly listAccounts: () => Fx<ReadonlyArray<Account>>
  readonly updateAccount: (id: string, patch: AccountPatch) => Fx<Account, NotFound>
  readonly addCredit: (id: string, amountMicros: number) => Fx<Account, NotFound>
  readonly createKey: (accountId: string, input: NewKey) => Fx<CreatedKey, NotFound>
  readonly getKey: (id: string) => Fx<ApiKey, NotFound>
  readonly listKeys: (accountId: string) => Fx<ReadonlyArray<ApiKey>>
  readonly updateKey: (id: string, patch: KeyPatch) => Fx<ApiKey, NotFound>
  readonly revokeKey: (id: string) => Fx<ApiKey, NotFound>
  /** Revokes every key of the account not revoked yet (closing an account). */
  readonly revokeKeysOf: (accountId: string) => Fx<void>
  /** The key with this hash and its account, if any. */
  readonly findByHash: (hash: string) => Fx<Option.Option<{ key: ApiKey; account: Account }>>
}

export class Repository extends Context.Tag("@swarmgate/auth/Repository")<Repository, RepositoryShape>() {}

const newId = (prefix: string) => `${prefix}_${randomUUID().replaceAll("-", "")}`

export const make = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const unavailable = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
    Effect.catchTag(effect as Effect.Effect<A, E | { readonly _tag: "SqlError" }, R>, "SqlError", (cause) =>
      Effect.fail(new RepositoryUnavailable({ cause })),
    ) as Effect.Effect<A, Exclude<E, { readonly _tag: "SqlError" }> | RepositoryUnavailable, R>

  const getAccount = (id: string) =>
    unavailable(
      Effect.flatMap(sql<AccountRow>`SELECT * FROM accounts WHERE id = ${id}`, (rows) =>
        rows[0] ? Effect.succeed(toAccount(rows[0])) : Effect.fail(new NotFound({ entity: "account", id })),
      ),
    )

  const getKey = (id: string) =>
    unavailable(
      Effect.flatMap(sql<KeyRow>`SELECT * FROM api_keys WHERE id = ${id}`, (rows) =>
        rows[0] ? Effect.succeed(toKey(rows[0])) : Effect.fail(new NotFound({ entity: "key", id })),
      ),
    )

  const repository: RepositoryShape = {
    createAccount: (input) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const id = newId("acct")
        const balance = input.balanceMicros ?? 0
        yield* sql.withTransaction(
          Effect.gen(function* () {
            yield* sql`INSERT INTO accounts ${sql.insert({
              id,
              name: input.name,
              status: input.status ?? "active",
              payment_hold: 0,
              balance_micros: balance,
              monthly_spend_limit_micros: input.monthlySpendLimitMicros ?? null,
              limits: JSON.stringify(input.limits ?? {}),
              email: input.email ?? null,
              email_verified: input.emailVerified === false ? 0 : 1,
              created_at: now,
              updated_at: now,
            })}`
            if (balance !== 0) {
              yield* sql`INSERT INTO balance_movements ${sql.insert({
                id: newId("mov"),
                account_id: id,
                kind: "credit",
                amount_micros: balance,
                request_id: null,
                created_at: now,
              })}`
            }
          }),
        )
        return yield* getAccount(id)
      }).pipe(unavailable, Effect.catchTag("NotFound", Effect.die)),

    getAccount,

    listAccounts: () =>
      unavailable(
        Effect.map(sql<AccountRow>`SELECT * FROM accounts ORDER BY created_at`, (rows) =>
          rows.map(toAccount),
        ),
      ),

    updateAccount: (id, patch) =>
      Effect.gen(function* () {
        yield* getAccount(id)
        const now = yield* Clock.currentTimeMillis
        const set: Record<string, unknown> = { updated_at: now }
        if (patch.status !== undefined) set.status = patch.status
        if (patch.email !== undefined) set.email = patch.email
        if (patch.emailVerified !== undefined) set.email_verified = patch.emailVerified ? 1 : 0
        if (patch.paymentHold !== undefined) set.payment_hold = patch.paymentHold ? 1 : 0
        if (patch.monthlySpendLimitMicros !== undefined)
          set.monthly_spend_limit_micros = patch.monthlySpendLimitMicros
        if (patch.limits !== undefined) set.limits = JSON.stringify(patch.limits)
        yield* sql`UPDATE accounts SET ${sql.update(set)} WHERE id = ${id}`
        return yield* getAccount(id)
      }).pipe(unavailable),

    addCredit: (id, amountMicros) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        yield* sql.withTransaction(
          Effect.gen(function* () {
            // Written before anything is read: a SQLite transaction that reads first fails (SQLITE_BUSY_SNAPSHOT)
            // when the ledger's writer thread commits in between (SqliteWriter.ts).
            const updated = yield* sql<{
              id: string
            }>`UPDATE accounts SET balance_micros = balance_micros + ${amountMicros}, updated_at = ${now} WHERE id = ${id} RETURNING id`
            if (updated.length === 0) return yield* Effect.fail(new NotFound({ entity: "account", id }))
            yield* sql`INSERT INTO balance_movements ${sql.insert({
              id: newId("mov"),
              account_id: id,
              kind: "credit",
              amount_micros: amountMicros,
              request_id: null,
              created_at: now,
            })}`
          }),
        )
        return yield* getAccount(id)
      }).pipe(unavailable),

    createKey: (accountId, input) =>
      Effect.gen(function* () {
        yield* getAccount(accountId)
        const now = yield* Clock.currentTimeMillis
        const generated = generateKey()
        const id = newId("key")
        yield* sql`INSERT INTO api_keys ${sql.insert({
          id,
          account_id: accountId,
          key_hash: generated.hash,
          prefix: generated.prefix,
          name: input.name ?? null,
          disabled: 0,
          revoked_at: null,
          expires_at: input.expiresAt ?? null,
          spend_limit_micros: input.spendLimitMicros ?? null,
          created_at: now,
          updated_at: now,
        })}`
        const key = yield* getKey(id).pipe(Effect.catchTag("NotFound", Effect.die))
        return { key, secret: generated.key }
      }).pipe(unavailable),

    getKey,

    listKeys: (accountId) =>
      unavailable(
        Effect.map(
          sql<KeyRow>`SELECT * FROM api_keys WHERE account_id = ${accountId} ORDER BY created_at`,
          (rows) => rows.map(toKey),
        ),
      ),

    updateKey: (id, patch) =>
      Effect.gen(function* () {
        yield* getKey(id)
        const now = yield* Clock.currentTimeMillis
        const set: Record<string, unknown> = { updated_at: now }
        if (patch.disabled !== undefined) set.disabled = patch.disabled ? 1 : 0
        if (patch.spendLimitMicros !== undefined) set.spend_limit_micros = patch.spendLimitMicros
        yield* sql`UPDATE api_keys SET ${sql.update(set)} WHERE id = ${id}`
        return yield* getKey(id)
      }).pipe(unavailable),

    revokeKey: (id) =>
      Effect.gen(function* () {
        yield* getKey(id)
        const now = yield* Clock.currentTimeMillis
        // Revocation is final: the first revocation time is kept.
        yield* sql`UPDATE api_keys SET revoked_at = ${now}, updated_at = ${now} WHERE id = ${id} AND revoked_at IS NULL`
        return yield* getKey(id)
      }).pipe(unavailable),

    revokeKeysOf: (accountId) =>
      Effect.flatMap(
        Clock.currentTimeMillis,
        (now) =>
          sql`UPDATE api_keys SET revoked_at = ${now}, updated_at = ${now} WHERE account_id = ${accountId} AND revoked_at IS NULL`,
      ).pipe(Effect.asVoid, unavailable),

    findByHash: (hash) =>
      Effect.gen(function* () {
        const keys = yield* sql<KeyRow>`SELECT * FROM api_keys WHERE key_hash = ${hash}`
        const row = keys[0]
        if (!row) return Option.none()
        const accounts = yield* sql<AccountRow>`SELECT * FROM accounts WHERE id = ${row.account_id}`
        const account = accounts[0]
        if (!account) return Option.none()
        return Option.some({ key: toKey(row), account: toAccount(account) })
      }).pipe(unavailable),
  }
  return repository
})

export const layer = Layer.effect(Repository, make)
