/**
 * The SQL client for `DATABASE_URL`, migrated at start-up: SQLite (the
 * embedded default, better-sqlite3) or PostgreSQL.
 */
import { mkdirSync } from "node:fs"
import { dirname } from "node:path"
import { NodeContext } from "@effect/platform-node"
import { SqlClient } from "@effect/sql"
import { PgClient, PgMigrator } from "@effect/sql-pg"
import { SqliteClient, SqliteMigrator } from "@effect/sql-sqlite-node"
import { Config, Context, Data, Duration, Effect, Layer, Redacted } from "effect"
import { migrations } from "./Migrations"
import * as SqliteWriter from "./SqliteWriter"

export const DEFAULT_DATABASE_URL = "sqlite:./data/swarmgate.db"

export type DatabaseTarget =
  | { readonly _tag: "Sqlite"; readonly filename: string }
  | { readonly _tag: "Postgres"; readonly url: string }

export class InvalidDatabaseUrl extends Data.TaggedError("InvalidDatabaseUrl")<{ readonly reason: string }> {
  override get message() {
    return this.reason
  }
}

export const parseDatabaseUrl = (url: string): Effect.Effect<DatabaseTarget, InvalidDatabaseUrl> => {
  if (url.startsWith("postgres://") || url.startsWith("postgresql://")) {
    return Effect.succeed({ _tag: "Postgres", url })
  }
  if (url.startsWith("sqlite:")) {
    const filename = url.slice("sqlite:".length).replace(/^\/\/(?=\/)/, "")
    if (filename.length === 0)
      return Effect.fail(new InvalidDatabaseUrl({ reason: "sqlite: needs a file name or :memory:" }))
    return Effect.succeed({ _tag: "Sqlite", filename })
  }
  return Effect.fail(
    new InvalidDatabaseUrl({
      reason: "DATABASE_URL must start with sqlite: or postgres:// (got another scheme)",
    }),
  )
}

/** No writer thread: writes go through the `SqlClient`. */
const noWriter = Layer.succeed(SqliteWriter.SqliteWriter, undefined)

const sqlite = (filename: string) => {
  if (filename !== ":memory:") mkdirSync(dirname(filename), { recursive: true })
  // WAL with synchronous=NORMAL: a commit survives a crash of the process (the ledger's batches are
  // written at once, not fsynced one by one on the event loop); an OS crash or power loss can lose the
  // last commits. PostgreSQL is the mode for more (README, Configuration).
  const client = Layer.tap(SqliteClient.layer({ filename }), (context) =>
    Effect.asVoid(Context.get(context, SqlClient.SqlClient)`PRAGMA synchronous = NORMAL`),
  )
  const migrated = SqliteMigrator.layer({ loader: migrations }).pipe(
    Layer.provide(NodeContext.layer),
    Layer.provideMerge(client),
  )
  // The ledger's batches go to a writer thread; an in-memory database has only its own connection.
  return Layer.merge(migrated, filename === ":memory:" ? noWriter : SqliteWriter.layer(filename))
}

/**
 * PgMigrator runs the migrations under a lock on `effect_sql_migrations`, but
 * creates that table unlocked: two instances starting at once on a fresh
 * database race on its CREATE TABLE and one fails. Create it first (same DDL as
 * the Migrator) under a transaction-scoped advisory lock.
 */
const ensurePgMigrationsTable = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql.withTransaction(
    Effect.zipRight(
      sql`SELECT pg_advisory_xact_lock(hashtext('swarmgate:effect_sql_migrations'))`,
      sql`CREATE TABLE IF NOT EXISTS effect_sql_migrations (
        migration_id integer primary key,
        created_at timestamp with time zone not null default now(),
        name text not null
      )`,
    ),
  ),
)

/**
 * How long a new connection to PostgreSQL may take: without a bound, a server
 * that accepts and never answers (or a dropped route) held start-up, and each
 * query that needed a new connection, until the operating system gave up.
 */
export const PG_CONNECT_TIMEOUT_MILLIS = 10_000

const postgres = (url: string, connectTimeoutMillis: number) => {
  const client = PgClient.layer({
    url: Redacted.make(url),
    maxConnections: 10,
    connectTimeout: Duration.millis(connectTimeoutMillis),
  })
  return Layer.effectDiscard(
    Effect.zipRight(ensurePgMigrationsTable, PgMigrator.run({ loader: migrations })),
  ).pipe(Layer.provide(NodeContext.layer), Layer.provideMerge(client), Layer.merge(noWriter))
}

/** What `layer` provides: the SQL client, and for a SQLite file its writer thread. */
export type Services = SqlClient.SqlClient | SqliteWriter.SqliteWriter

/**
 * A migrated `SqlClient` for the given URL (with a `SqliteWriter` for a SQLite file);
 * `connectTimeoutMillis` bounds each new PostgreSQL connection.
 */
export const layer = (
  url: string,
  connectTimeoutMillis: number = PG_CONNECT_TIMEOUT_MILLIS,
): Layer.Layer<Services, unknown> =>
  Layer.unwrapEffect(
    Effect.map(
      parseDatabaseUrl(url),
      (target): Layer.Layer<Services, unknown> =>
        target._tag === "Sqlite" ? sqlite(target.filename) : postgres(target.url, connectTimeoutMillis),
    ),
  )

/** `DATABASE_URL`, defaulting to the embedded SQLite file. */
export const layerConfig: Layer.Layer<Services, unknown> = Layer.unwrapEffect(
  Effect.map(Config.string("DATABASE_URL").pipe(Config.withDefault(DEFAULT_DATABASE_URL)), layer),
)

/** PostgreSQL and SQLite disagree on BIGINT (string vs number); read either as a number. */
export const toNumber = (value: unknown): number => (typeof value === "number" ? value : Number(value))
