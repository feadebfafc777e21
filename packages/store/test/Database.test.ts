import type { AddressInfo } from "node:net"
import { createServer } from "node:net"
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it, layer } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted } from "effect"
import { Database, TestDatabase } from "../src/index"

const TABLES = [
  "accounts",
  "api_keys",
  "balance_movements",
  "usage_records",
  "applications",
  "access_tokens",
  "mail_outbox",
  "apply_attempts",
  "console_sessions",
]
const MIGRATIONS = [
  [1, "initial"],
  [2, "lifecycle"],
]
const INDEXES = [
  "api_keys_account",
  "balance_movements_account",
  "usage_records_account",
  "usage_records_key",
]
/** 2^53 − 1: the largest micro-dollar amount a JS number holds exactly. */
const BIG = Number.MAX_SAFE_INTEGER

const sqliteObjects = (type: "table" | "index") =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ name: string }>`SELECT name FROM sqlite_master WHERE type = ${type} ORDER BY name`,
      (rows) => rows.map((row) => row.name),
    ),
  )

const pgTables = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ table_name: string }>`SELECT table_name FROM information_schema.tables
      WHERE table_schema = 'public' ORDER BY table_name`,
    (rows) => rows.map((row) => row.table_name),
  ),
)

const migrationIds = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ migration_id: number; name: string }>`SELECT migration_id, name FROM effect_sql_migrations`,
    (rows) => rows.map((row) => [row.migration_id, row.name]),
  ),
)

/** An account with a BIGINT balance, then the raw and the `toNumber` reading of it. */
const roundTripBigint = (id: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`INSERT INTO accounts (id, name, status, balance_micros, created_at, updated_at)
      VALUES (${id}, 'Acme', 'active', ${BIG}, ${1_700_000_000_000}, ${1_700_000_000_000})`
    const [row] = yield* sql<{
      balance_micros: unknown
      created_at: unknown
      payment_hold: unknown
    }>`SELECT balance_micros, created_at, payment_hold FROM accounts WHERE id = ${id}`
    const [count] = yield* sql<{ n: unknown }>`SELECT COUNT(*) AS n FROM accounts WHERE id = ${id}`
    return { row: row!, count: count!.n }
  })

describe("parseDatabaseUrl", () => {
  it.effect("reads sqlite:<file> as a SQLite file, relative or absolute", () =>
    Effect.gen(function* () {
      expect(yield* Database.parseDatabaseUrl("sqlite:./data/swarmgate.db")).toEqual({
        _tag: "Sqlite",
        filename: "./data/swarmgate.db",
      })
      expect(yield* Database.parseDatabaseUrl("sqlite:/var/lib/swarmgate.db")).toEqual({
        _tag: "Sqlite",
        filename: "/var/lib/swarmgate.db",
      })
      expect(yield* Database.parseDatabaseUrl("sqlite:///var/lib/swarmgate.db")).toEqual({
        _tag: "Sqlite",
        filename: "/var/lib/swarmgate.db",
      })
    }),
  )

  it.effect("reads sqlite::memory: as an in-memory SQLite database", () =>
    Effect.gen(function* () {
      expect(yield* Database.parseDatabaseUrl("sqlite::memory:")).toEqual({
        _tag: "Sqlite",
        filename: ":memory:",
      })
    }),
  )

  it.effect("passes postgres:// and postgresql:// URLs through unchanged", () =>
    Effect.gen(function* () {
      const a = "postgres://app:secret@db.internal:5432/swarmgate?sslmode=require"
      const b = "postgresql://postgres@127.0.0.1/test"
      expect(yield* Database.parseDatabaseUrl(a)).toEqual({ _tag: "Postgres", url: a })
      expect(yield* Database.parseDatabaseUrl(b)).toEqual({ _tag: "Postgres", url: b })
    }),
  )

  it.effect("refuses other schemes and an empty sqlite: with InvalidDatabaseUrl", () =>
    Effect.gen(function* () {
      for (const url of ["mysql://root@localhost/db", "./data/swarmgate.db", "", "sqlite:", "postgres:/x"]) {
        const exit = yield* Effect.exit(Database.parseDatabaseUrl(url))
        expect(Exit.isFailure(exit), url).toBe(true)
        if (Exit.isFailure(exit)) {
          expect(exit.cause).toMatchObject({ _tag: "Fail", error: { _tag: "InvalidDatabaseUrl" } })
        }
      }
      const error = yield* Effect.flip(Database.parseDatabaseUrl("mysql://root@localhost/db"))
      expect(error).toBeInstanceOf(Database.InvalidDatabaseUrl)
      expect(error.message).toContain("sqlite: or postgres://")
      expect(error.message).not.toContain("root@localhost")
    }),
  )

  it.effect("Database.layer fails to build with InvalidDatabaseUrl for a bad URL", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(
        Effect.scoped(Layer.build(Database.layer("mysql://root@localhost/db"))),
      )
      expect(error).toBeInstanceOf(Database.InvalidDatabaseUrl)
    }),
  )

  it.live("Database.layer gives up on a PostgreSQL server that accepts and never answers", () =>
    Effect.gen(function* () {
      // Accepts the connection and says nothing: without a connect timeout the start-up waited for good.
      const silent = createServer(() => undefined)
      yield* Effect.acquireRelease(
        Effect.promise(() => new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve))),
        () => Effect.sync(() => silent.close()),
      )
      const { port } = silent.address() as AddressInfo
      const exit = yield* Effect.exit(
        Effect.scoped(Layer.build(Database.layer(`postgres://postgres@127.0.0.1:${port}/test`, 300))),
      )
      // A failure, not a wait: the old start-up never ended (the test's own timeout is the bound).
      expect(Exit.isFailure(exit)).toBe(true)
    }).pipe(Effect.scoped),
  )
})

describe("toNumber", () => {
  it("reads SQLite numbers and PostgreSQL BIGINT/COUNT strings as numbers", () => {
    expect(Database.toNumber(42)).toBe(42)
    expect(Database.toNumber("42")).toBe(42)
    expect(Database.toNumber("-1500000")).toBe(-1_500_000)
    expect(Database.toNumber(String(BIG))).toBe(BIG)
    expect(Database.toNumber(12n)).toBe(12)
    expect(Database.toNumber(0)).toBe(0)
  })
})

layer(Database.layer("sqlite::memory:"))("migrations on SQLite in memory", (it) => {
  it.effect("create the tables, their indexes and the migration record", () =>
    Effect.gen(function* () {
      const tables = yield* sqliteObjects("table")
      for (const table of TABLES) expect(tables).toContain(table)
      expect(tables).toContain("effect_sql_migrations")
      const indexes = yield* sqliteObjects("index")
      for (const index of INDEXES) expect(indexes).toContain(index)
      expect(yield* migrationIds).toEqual(MIGRATIONS)
    }),
  )

  it.effect("store BIGINT money as numbers that toNumber reads unchanged", () =>
    Effect.gen(function* () {
      const { row, count } = yield* roundTripBigint("acct_sqlite")
      expect(row.balance_micros).toBe(BIG)
      expect(Database.toNumber(row.balance_micros)).toBe(BIG)
      expect(Database.toNumber(row.created_at)).toBe(1_700_000_000_000)
      expect(Database.toNumber(row.payment_hold)).toBe(0)
      expect(Database.toNumber(count)).toBe(1)
    }),
  )

  it.effect("enforce the foreign keys' columns: a key needs an account id", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const exit = yield* Effect.exit(
        sql`INSERT INTO api_keys (id, key_hash, prefix, created_at, updated_at) VALUES ('k', 'h', 'p', 1, 1)`,
      )
      expect(Exit.isFailure(exit)).toBe(true)
    }),
  )
})

describe("migrations on a SQLite file", () => {
  it.scoped("create the tables once; a second start finds them and keeps the data", () =>
    Effect.gen(function* () {
      const url = yield* TestDatabase.withTemporarySqliteFile("swarmgate-store")
      const first = Effect.gen(function* () {
        const tables = yield* sqliteObjects("table")
        for (const table of TABLES) expect(tables).toContain(table)
        yield* roundTripBigint("acct_file")
      })
      yield* Effect.provide(first, Database.layer(url))
      const second = Effect.gen(function* () {
        expect(yield* migrationIds).toEqual(MIGRATIONS)
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ balance_micros: unknown }>`SELECT balance_micros FROM accounts`
        expect(rows.map((row) => Database.toNumber(row.balance_micros))).toEqual([BIG])
      })
      yield* Effect.provide(second, Database.layer(url))
    }),
  )

  it.scoped("create the parent directory of a file that does not exist yet", () =>
    Effect.gen(function* () {
      const url = yield* TestDatabase.withTemporarySqliteFile("swarmgate-store")
      const nested = url.replace(/swarmgate-store\.db$/, "nested/deeper/swarmgate-store.db")
      const tables = yield* Effect.provide(sqliteObjects("table"), Database.layer(nested))
      for (const table of TABLES) expect(tables).toContain(table)
    }),
  )
})

describe("TestDatabase helpers", () => {
  it("names temporary databases as PostgreSQL identifiers with a random suffix", () => {
    const a = TestDatabase.temporaryDatabaseName("swarmgate_store")
    const b = TestDatabase.temporaryDatabaseName("swarmgate_store")
    expect(a).toMatch(/^swarmgate_store_[0-9a-f]{12}$/)
    expect(a).not.toBe(b)
    expect(TestDatabase.temporaryDatabaseName("9 Lives-Suite")).toMatch(/^_9_lives_suite_[0-9a-f]{12}$/)
    expect(TestDatabase.temporaryDatabaseName("x".repeat(100)).length).toBeLessThanOrEqual(63)
  })

  it("replaces only the database of a URL", () => {
    expect(TestDatabase.withDatabase("postgres://postgres@127.0.0.1:5432/test", "other")).toBe(
      "postgres://postgres@127.0.0.1:5432/other",
    )
    expect(TestDatabase.withDatabase("postgresql://u:p@h/db?sslmode=disable", "x_1")).toBe(
      "postgresql://u:p@h/x_1?sslmode=disable",
    )
  })
})

// ---------------------------------------------------------------------------------------------
// PostgreSQL: a fresh database per suite on the server of TEST_DATABASE_URL.

/** Whether a database exists, asked on the admin database. */
const pgDatabaseExists = (name: string) =>
  Effect.flatMap(PgClient.PgClient, (sql) =>
    Effect.map(sql`SELECT 1 FROM pg_database WHERE datname = ${name}`, (rows) => rows.length === 1),
  ).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(TestDatabase.pgUrl!), maxConnections: 1 })))

const databaseOf = (url: string) => new URL(url).pathname.slice(1)

class FreshPgUrl extends Context.Tag("test/FreshPgUrl")<FreshPgUrl, string>() {}

TestDatabase.describePg(describe, "Database on PostgreSQL", () => {
  const Fresh = Layer.scoped(FreshPgUrl, TestDatabase.withTemporaryPgDatabase("swarmgate_store"))
  const Migrated = Layer.unwrapEffect(Effect.map(FreshPgUrl, Database.layer)).pipe(Layer.provideMerge(Fresh))

  layer(Migrated, { timeout: 30_000 })("a fresh database", (it) => {
    it.effect("is a swarmgate_store_<random> database, and migrations created the tables", () =>
      Effect.gen(function* () {
        const url = yield* FreshPgUrl
        expect(databaseOf(url)).toMatch(/^swarmgate_store_[0-9a-f]{12}$/)
        const sql = yield* SqlClient.SqlClient
        const [current] = yield* sql<{ db: string }>`SELECT current_database() AS db`
        expect(current!.db).toBe(databaseOf(url))
        const tables = yield* pgTables
        for (const table of TABLES) expect(tables).toContain(table)
        expect(tables).toContain("effect_sql_migrations")
        expect(yield* migrationIds).toEqual(MIGRATIONS)
      }),
    )

    it.effect("returns BIGINT and COUNT as strings, which toNumber reads as numbers", () =>
      Effect.gen(function* () {
        const { row, count } = yield* roundTripBigint("acct_pg")
        expect(row.balance_micros).toBe(String(BIG))
        expect(Database.toNumber(row.balance_micros)).toBe(BIG)
        expect(Database.toNumber(row.created_at)).toBe(1_700_000_000_000)
        expect(Database.toNumber(row.payment_hold)).toBe(0)
        expect(count).toBe("1")
        expect(Database.toNumber(count)).toBe(1)
        const sql = yield* SqlClient.SqlClient
        const [sum] = yield* sql<{ total: unknown }>`SELECT SUM(balance_micros) AS total FROM accounts`
        expect(Database.toNumber(sum!.total)).toBe(BIG)
      }),
    )

    it.effect("starting the layer again on a migrated database changes nothing", () =>
      Effect.gen(function* () {
        const url = yield* FreshPgUrl
        const ids = yield* Effect.provide(migrationIds, Database.layer(url))
        expect(ids).toEqual(MIGRATIONS)
      }),
    )
  })

  it.effect(
    "instances starting at once on the same fresh database all come up, migrated once",
    () => {
      // Two would do; four, three times over, make a race on the migrations table near certain to show.
      const race = Effect.gen(function* () {
        const url = yield* TestDatabase.withTemporaryPgDatabase("swarmgate_store")
        const contexts = yield* Effect.all(
          Array.from({ length: 4 }, () => Layer.build(Database.layer(url))),
          { concurrency: "unbounded" },
        )
        for (const context of contexts) {
          const tables = yield* Effect.provide(pgTables, context)
          for (const table of TABLES) expect(tables).toContain(table)
          expect(yield* Effect.provide(migrationIds, context)).toEqual(MIGRATIONS)
        }
      })
      return Effect.repeatN(Effect.scoped(race), 2)
    },
    30_000,
  )

  it.effect(
    "withTemporaryPgDatabase drops its database when the scope closes",
    () =>
      Effect.gen(function* () {
        const name = yield* Effect.scoped(
          Effect.gen(function* () {
            const url = yield* TestDatabase.withTemporaryPgDatabase("swarmgate_store")
            const name = databaseOf(url)
            expect(yield* pgDatabaseExists(name)).toBe(true)
            // A client of the database, closed (it is acquired later in the scope) before the drop.
            yield* Effect.provide(pgTables, Database.layer(url))
            yield* Layer.build(Database.layer(url))
            return name
          }),
        )
        expect(yield* pgDatabaseExists(name)).toBe(false)
      }),
    30_000,
  )
})
