/**
 * The SQL ledger (SQLite or PostgreSQL, the same tables): append-only usage
 * records and balance movements, and the reads that rebuild the in-memory
 * book. Every charge is one usage record, one `charge` movement with the id
 * `chg_<request id>` and its share of one balance update, all in the same
 * transaction; the request id is the primary key of both rows, so a charge
 * can never be written twice. A batch is written by one of three paths: a
 * SQLite file's writer thread (32 rows per run of a prepared INSERT, the rest
 * row by row), an in-memory SQLite database's
 * own connection (one JSON parameter), PostgreSQL (one statement of data-modifying CTEs over one JSON parameter).
 */
import { SqlClient, type SqlError } from "@effect/sql"
import { Database, SqliteWriter } from "@swarmgate/store"
import { Effect } from "effect"

const toNumber = Database.toNumber

export type UsageOutcome = "completed" | "upstream_error" | "upstream_timeout" | "client_disconnected"

/** One settled request, as it goes into the ledger. */
export interface UsageEntry {
  readonly requestId: string
  readonly accountId: string
  readonly keyId: string
  readonly model: string
  readonly promptTokens: number
  readonly completionTokens: number
  readonly costMicros: number
  /** The hold it was settled against (not stored: the cost never exceeds it). */
  readonly holdMicros: number
  readonly outcome: UsageOutcome
  readonly startedAt: number
  readonly createdAt: number
}

export const chargeId = (requestId: string) => `chg_${requestId}`

/** Ids per `IN (…)` of a read; rows per statement of a PostgreSQL batch. */
const IDS_PER_READ = 200

const slices = <A>(items: ReadonlyArray<A>, size: number): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size))
  return out
}

/** The columns of a usage record and of a charge, in the order of `usageParams` and `chargeParams`. */
const USAGE_COLUMNS =
  "request_id, account_id, key_id, model, prompt_tokens, completion_tokens, cost_micros, outcome, started_at, created_at"
const CHARGE_COLUMNS = "id, account_id, kind, amount_micros, request_id, created_at"

/**
 * SQLite on the `SqlClient`'s own connection (an in-memory database, or a
 * file whose writer thread is unavailable) takes a whole batch as one JSON
 * parameter, read back by `json_each`: three statements whatever the batch
 * size, each one Effect step instead of one per row. Rows of `batchJson`
 * (`usageParams`), by position.
 */

const USAGE_FROM_JSON = `INSERT INTO usage_records (${USAGE_COLUMNS})
  SELECT value->>0, value->>1, value->>2, value->>3, value->>4, value->>5, value->>6, value->>7, value->>8, value->>9
  FROM json_each(?)`
const CHARGES_FROM_JSON = `INSERT INTO balance_movements (${CHARGE_COLUMNS})
  SELECT 'chg_' || (value->>0), value->>1, 'charge', value->>6, value->>0, value->>9
  FROM json_each(?)`

const BALANCES_FROM_JSON = `UPDATE accounts SET balance_micros = balance_micros -
    (SELECT SUM(value->>6) FROM json_each(?) WHERE value->>1 = accounts.id)
  WHERE id IN (SELECT value->>1 FROM json_each(?))`

const batchJson = (entries: ReadonlyArray<UsageEntry>) => JSON.stringify(entries.map((e) => pushUsage([], e)))

/**
 * PostgreSQL: a whole batch as one statement (data-modifying CTEs over the
 * same JSON rows), so one round trip and its own transaction: all or nothing
 * as before, without the BEGIN, the COMMIT and a statement per table and
 * account — each a round trip, and ~150 Effect steps in @effect/sql.
 */
const BATCH_PG = `WITH batch AS (
    SELECT v->>0 AS request_id, v->>1 AS account_id, v->>2 AS key_id, v->>3 AS model,
      (v->>4)::integer AS prompt_tokens, (v->>5)::integer AS completion_tokens,
      (v->>6)::bigint AS cost_micros, v->>7 AS outcome, (v->>8)::bigint AS started_at,
      (v->>9)::bigint AS created_at
    FROM jsonb_array_elements($1::jsonb) AS v
  ), usage AS (
    INSERT INTO usage_records (${USAGE_COLUMNS})
    SELECT request_id, account_id, key_id, model, prompt_tokens, completion_tokens, cost_micros, outcome,
      started_at, created_at
    FROM batch
  ), charges AS (
    INSERT INTO balance_movements (${CHARGE_COLUMNS})
    SELECT 'chg_' || request_id, account_id, 'charge', cost_micros, request_id, created_at FROM batch
  )
  UPDATE accounts SET balance_micros = accounts.balance_micros - totals.total
  FROM (SELECT account_id, SUM(cost_micros) AS total FROM batch GROUP BY account_id) AS totals
  WHERE accounts.id = totals.account_id`

const usageRow = (e: UsageEntry) => ({
  request_id: e.requestId,
  account_id: e.accountId,
  key_id: e.keyId,
  model: e.model,
  prompt_tokens: e.promptTokens,
  completion_tokens: e.completionTokens,
  cost_micros: e.costMicros,
  outcome: e.outcome,
  started_at: e.startedAt,
  created_at: e.createdAt,
})

const chargeRow = (e: UsageEntry) => ({
  id: chargeId(e.requestId),
  account_id: e.accountId,
  kind: "charge",
  amount_micros: e.costMicros,
  request_id: e.requestId,
  created_at: e.createdAt,
})

const totalsByAccount = (entries: ReadonlyArray<UsageEntry>) => {
  const totals = new Map<string, number>()
  for (const e of entries) totals.set(e.accountId, (totals.get(e.accountId) ?? 0) + e.costMicros)
  return totals
}

/** Appends a batch in one transaction (group commit). Fails as a whole, e.g. on a request id already present. */
export const writeBatch = (
  entries: ReadonlyArray<UsageEntry>,
): Effect.Effect<void, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.flatMap(SqliteWriter.SqliteWriter, (writer) => {
    if (writer === undefined) return writeBatchOnConnection(entries)
    // A SQLite file: on the writer thread, off the event loop, rows inserted many per run of a
    // prepared statement (json_each cost ~25 % more than a run per row: it parses each row's JSON
    // again per column; many rows per run cost ~35 % less than a run per row).
    // Each entry's values once, in one flat array: the charge statement binds some of them again.
    const values: Array<SqliteWriter.SqlValue> = []
    for (const e of entries) pushUsage(values, e)
    const debits: Array<SqliteWriter.SqlValue> = []
    for (const [id, total] of totalsByAccount(entries)) debits.push(total, id)
    return Effect.asVoid(
      writer
        .transaction([
          { sql: INSERT_USAGE, width: USAGE_WIDTH, values, manyRows: true },
          { sql: INSERT_CHARGE, width: USAGE_WIDTH, values, pick: CHARGE_PICK, manyRows: true },
          { sql: DEBIT_BALANCE, width: 2, values: debits },
        ])
        .pipe(
          // The thread never ran it: one transaction here, not the caller's row-by-row fallback.
          Effect.catchIf(SqliteWriter.isUnavailable, () => writeBatchOnConnection(entries)),
        ),
    )
  })

const INSERT_USAGE = `INSERT INTO usage_records (${USAGE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
/** Values per entry in the writer's batch, in `USAGE_COLUMNS` order. */
const USAGE_WIDTH = 10
// The charge's id is `chargeId(request_id)`, made here by SQLite from the entry's own values.
const INSERT_CHARGE = `INSERT INTO balance_movements (${CHARGE_COLUMNS}) VALUES ('chg_' || ?, ?, 'charge', ?, ?, ?)`
/** The entry's values the charge binds: request id, account, cost, request id, created. */
const CHARGE_PICK: ReadonlyArray<number> = [0, 1, 6, 0, 9]
const DEBIT_BALANCE = "UPDATE accounts SET balance_micros = balance_micros - ? WHERE id = ?"

/** Appends `e`'s values to `values`, in `USAGE_COLUMNS` order; returns `values`. */
const pushUsage = (values: Array<SqliteWriter.SqlValue>, e: UsageEntry): Array<SqliteWriter.SqlValue> => {
  values.push(
    e.requestId,
    e.accountId,
    e.keyId,
    e.model,
    e.promptTokens,
    e.completionTokens,
    e.costMicros,
    e.outcome,
    e.startedAt,
    e.createdAt,
  )
  return values
}

/** `writeBatch` on the `SqlClient`'s own connection. */
const writeBatchOnConnection = (
  entries: ReadonlyArray<UsageEntry>,
): Effect.Effect<void, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql.onDialectOrElse({
      sqlite: () =>
        sql.withTransaction(
          Effect.gen(function* () {
            const rows = batchJson(entries)
            yield* sql.unsafe(USAGE_FROM_JSON, [rows])
            yield* sql.unsafe(CHARGES_FROM_JSON, [rows])
            yield* sql.unsafe(BALANCES_FROM_JSON, [rows, rows])
          }),
        ),
      // PostgreSQL (the other dialect the store runs on).
      orElse: () => Effect.asVoid(sql.unsafe(BATCH_PG, [batchJson(entries)])),
    }),
  )

/**
 * Appends one entry in its own transaction; `false` when its request id is
 * already in the ledger (a batch that committed but whose answer was lost).
 */
export const writeOne = (entry: UsageEntry): Effect.Effect<boolean, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql.withTransaction(
      Effect.gen(function* () {
        // Written before anything is read (a SQLite file's writer thread may commit meanwhile: SqliteWriter.ts).
        const inserted = yield* sql`INSERT INTO usage_records ${sql.insert(usageRow(entry))}
          ON CONFLICT (request_id) DO NOTHING RETURNING request_id`
        if (inserted.length === 0) return false
        yield* sql`INSERT INTO balance_movements ${sql.insert(chargeRow(entry))}`
        yield* sql`UPDATE accounts SET balance_micros = balance_micros - ${entry.costMicros} WHERE id = ${entry.accountId}`
        return true
      }),
    ),
  )

export interface LoadedAccount {
  readonly id: string
  readonly balanceMicros: number
  readonly spentMonthMicros: number
}

/** Balances and the spend since `monthStart`, for the given accounts or all of them. */
export const loadAccounts = (
  ids: ReadonlyArray<string> | "all",
  monthStart: number,
): Effect.Effect<ReadonlyArray<LoadedAccount>, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const balances: Array<{ id: string; balance_micros: number | string }> = []
    const spent = new Map<string, number>()
    const batches = ids === "all" ? [undefined] : slices(ids, IDS_PER_READ)
    for (const batch of batches) {
      if (batch !== undefined && batch.length === 0) continue
      const where = batch === undefined ? sql`1 = 1` : sql.in("id", batch)
      const whereUsage = batch === undefined ? sql`1 = 1` : sql.in("account_id", batch)
      balances.push(
        ...(yield* sql<{ id: string; balance_micros: number | string }>`
          SELECT id, balance_micros FROM accounts WHERE ${where}`),
      )
      const rows = yield* sql<{ account_id: string; spent: number | string }>`
        SELECT account_id, SUM(cost_micros) AS spent FROM usage_records
        WHERE ${whereUsage} AND created_at >= ${monthStart} GROUP BY account_id`
      for (const row of rows) spent.set(row.account_id, toNumber(row.spent))
    }
    return balances.map((row) => ({
      id: row.id,
      balanceMicros: toNumber(row.balance_micros),
      spentMonthMicros: spent.get(row.id) ?? 0,
    }))
  })

/** All-time spend of the given keys (or of every key). Keys without usage spent 0. */
export const loadKeys = (
  ids: ReadonlyArray<string> | "all",
): Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const spent = new Map<string, number>()
    if (ids === "all") {
      for (const row of yield* sql<{ id: string }>`SELECT id FROM api_keys`) spent.set(row.id, 0)
      const rows = yield* sql<{ key_id: string; spent: number | string }>`
        SELECT key_id, SUM(cost_micros) AS spent FROM usage_records GROUP BY key_id`
      for (const row of rows) spent.set(row.key_id, toNumber(row.spent))
      return spent
    }
    for (const batch of slices(ids, IDS_PER_READ)) {
      for (const id of batch) spent.set(id, 0)
      const rows = yield* sql<{ key_id: string; spent: number | string }>`
        SELECT key_id, SUM(cost_micros) AS spent FROM usage_records
        WHERE ${sql.in("key_id", batch)} GROUP BY key_id`
      for (const row of rows) spent.set(row.key_id, toNumber(row.spent))
    }
    return spent
  })

/** Committed balances (credits − written charges) of existing accounts. */
export const readBalances = (
  ids: ReadonlyArray<string>,
): Effect.Effect<ReadonlyMap<string, number>, SqlError.SqlError, SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const balances = new Map<string, number>()
    for (const batch of slices(ids, IDS_PER_READ)) {
      const rows = yield* sql<{ id: string; balance_micros: number | string }>`
        SELECT id, balance_micros FROM accounts WHERE ${sql.in("id", batch)}`
      for (const row of rows) balances.set(row.id, toNumber(row.balance_micros))
    }
    return balances
  })
