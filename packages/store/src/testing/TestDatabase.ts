/**
 * Databases for tests: a fresh PostgreSQL database per suite (created on the
 * server of `TEST_DATABASE_URL`, dropped when its scope closes), a temporary
 * SQLite file, and the rule for suites whose database is missing — skip with a
 * warning, or fail when `SWARMGATE_REQUIRE_SERVICES=1` (CI).
 *
 * This module loads no test framework (importing `vitest` outside a test run
 * throws): `describePg` takes the caller's `describe`.
 */
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import type { SqlClient } from "@effect/sql"
import type { SqlError } from "@effect/sql/SqlError"
import { PgClient } from "@effect/sql-pg"
import { Data, Effect, Layer, Redacted, type Scope } from "effect"
import * as Database from "../Database"

const nonEmpty = (value: string | undefined): string | undefined =>
  value === undefined || value.trim() === "" ? undefined : value.trim()

/** `TEST_DATABASE_URL`: a PostgreSQL server (and a database on it) the tests may create databases on. */
export const pgUrl: string | undefined = nonEmpty(process.env.TEST_DATABASE_URL)

/** Whether `TEST_DATABASE_URL` is set. */
export const pgAvailable: boolean = pgUrl !== undefined

/** `SWARMGATE_REQUIRE_SERVICES=1`: a suite whose service is missing fails instead of skipping. */
export const servicesRequired: boolean = process.env.SWARMGATE_REQUIRE_SERVICES === "1"

/** `TEST_DATABASE_URL` is unset and a PostgreSQL database was asked for. */
export class PgUnavailable extends Data.TaggedError("PgUnavailable")<{ readonly reason: string }> {
  override get message() {
    return this.reason
  }
}

const missingMessage = (suite: string) =>
  `${suite}: TEST_DATABASE_URL is not set (e.g. postgres://postgres@127.0.0.1:5432/test)`

const requiredMessage = (suite: string) => `${missingMessage(suite)}, and SWARMGATE_REQUIRE_SERVICES=1`

/**
 * For `describe.skipIf(TestDatabase.skipPg("…"))`: `false` when `TEST_DATABASE_URL`
 * is set; otherwise `true` with a `console.warn`, or a thrown error (the whole
 * test file fails) when `SWARMGATE_REQUIRE_SERVICES=1`.
 */
export const skipPg = (suite: string): boolean => {
  if (pgAvailable) return false
  if (servicesRequired) throw new Error(requiredMessage(suite))
  console.warn(`[skipped] ${missingMessage(suite)}: PostgreSQL tests skipped`)
  return true
}

/** The part of vitest's `describe` that `describePg` uses. */
export interface Describe {
  (name: string, body: (test: (name: string, body: () => void) => unknown) => void): unknown
  readonly skipIf: (condition: boolean) => (name: string, body: () => void) => unknown
}

/**
 * `describe(name, body)` for a suite that needs PostgreSQL. Without
 * `TEST_DATABASE_URL` the suite is skipped with a `console.warn`, or, when
 * `SWARMGATE_REQUIRE_SERVICES=1`, fails (the file's other suites still run).
 * Pass `describe` from `@effect/vitest` (or `vitest`).
 */
export const describePg = (describe: Describe, name: string, body: () => void): void => {
  if (!pgAvailable && servicesRequired) {
    describe(name, (test) => {
      test("needs PostgreSQL", () => {
        throw new Error(requiredMessage(name))
      })
    })
    return
  }
  describe.skipIf(skipPg(name))(name, body)
}

const adminStatement = (adminUrl: string, statement: string): Effect.Effect<void, SqlError> =>
  Effect.flatMap(PgClient.PgClient, (sql) => sql.unsafe(statement)).pipe(
    Effect.asVoid,
    Effect.provide(PgClient.layer({ url: Redacted.make(adminUrl), maxConnections: 1 })),
  )

/** `prefix` reduced to a PostgreSQL identifier, then `_` and 12 random hex digits (63 characters at most). */
export const temporaryDatabaseName = (prefix: string): string => {
  const base = prefix
    .toLowerCase()
    .replace(/[^a-z0-9_]/g, "_")
    .replace(/^[^a-z_]/, "_$&")
  return `${base.slice(0, 50)}_${randomBytes(6).toString("hex")}`
}

/** `url` with its database (path) replaced by `database`. */
export const withDatabase = (url: string, database: string): string => {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

/**
 * Creates a database named `<prefix>_<random>` on the server of `adminUrl`
 * (default `TEST_DATABASE_URL`) and returns its URL; the database is dropped
 * when the scope closes. Close every client of it first — acquire them later
 * in the same scope, as `layerPg` does: a drop that still finds connections
 * waits ~5 s, then warns and forces them off.
 */
export const withTemporaryPgDatabase = (
  prefix: string,
  adminUrl: string | undefined = pgUrl,
): Effect.Effect<string, SqlError | PgUnavailable, Scope.Scope> =>
  Effect.gen(function* () {
    if (adminUrl === undefined) return yield* new PgUnavailable({ reason: missingMessage(prefix) })
    const name = temporaryDatabaseName(prefix)
    yield* Effect.acquireRelease(adminStatement(adminUrl, `CREATE DATABASE ${name}`), () =>
      adminStatement(adminUrl, `DROP DATABASE IF EXISTS ${name}`).pipe(
        Effect.catchAll((error) =>
          Effect.zipRight(
            Effect.sync(() =>
              console.warn(`[TestDatabase] DROP DATABASE ${name} failed (${error.message}); forcing it`),
            ),
            adminStatement(adminUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
          ),
        ),
        Effect.orDie,
      ),
    )
    return withDatabase(adminUrl, name)
  })

/** A migrated `SqlClient` (`Database.layer`) on a fresh PostgreSQL database, dropped with the layer. */
export const layerPg = (prefix: string): Layer.Layer<SqlClient.SqlClient, unknown> =>
  Layer.unwrapScoped(Effect.map(withTemporaryPgDatabase(prefix), Database.layer))

/**
 * A `sqlite:<file>` URL in a new temporary directory, removed (with the file)
 * when the scope closes. The file does not exist until a client opens it.
 */
export const withTemporarySqliteFile = (prefix: string): Effect.Effect<string, never, Scope.Scope> =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => mkdtempSync(join(tmpdir(), `${prefix}-`))),
      (directory) => Effect.sync(() => rmSync(directory, { recursive: true, force: true })),
    ),
    (directory) => `sqlite:${join(directory, `${prefix}.db`)}`,
  )

/** A migrated `SqlClient` on a temporary SQLite file, removed with the layer. */
export const layerSqliteFile = (prefix: string): Layer.Layer<Database.Services, unknown> =>
  Layer.unwrapScoped(Effect.map(withTemporarySqliteFile(prefix), Database.layer))
