import { SqlClient } from "@effect/sql"
import { describe, expect, it, layer } from "@effect/vitest"
import { Cause, Effect, Exit, Layer, Option } from "effect"
import { Database, SqliteWriter, TestDatabase } from "../src/index"

const writer = Effect.flatMap(SqliteWriter.SqliteWriter, (w) =>
  w === undefined ? Effect.dieMessage("no SqliteWriter in context") : Effect.succeed(w),
)

const setUp = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql`CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY, n INTEGER NOT NULL)`,
)

const notes = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(sql<{ id: string; n: number }>`SELECT id, n FROM notes ORDER BY id`, (rows) =>
    rows.map((r) => `${r.id}=${r.n}`),
  ),
)

const insert = (id: string, n: number): SqliteWriter.Statement => ({
  sql: "INSERT INTO notes (id, n) VALUES (?, ?)",
  width: 2,
  values: [id, n],
})

describe("SqliteWriter", () => {
  layer(TestDatabase.layerSqliteFile("swarmgate_sqlite_writer"))((it) => {
    it.effect("commits a transaction's statements, seen at once by the main connection", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        yield* w.transaction([insert("a", 1), insert("b", 2)])
        expect(yield* notes).toEqual(["a=1", "b=2"])
      }),
    )

    it.effect("runs a statement once per row of its values; a shared array read through pick", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        // Rows of three: id, a number, another id. The second statement binds the third and the second.
        const values = ["kr1", 10, "s1", "kr2", 20, "s2", "kr3", 30, "s3"]
        yield* w.transaction([
          { sql: "INSERT INTO notes (id, n) VALUES (?, ?)", width: 3, values, pick: [0, 1] },
          { sql: "INSERT INTO notes (id, n) VALUES ('kx' || ?, ? + 1)", width: 3, values, pick: [2, 1] },
          { sql: "INSERT INTO notes (id, n) VALUES (?, ?)", width: 2, values: ["kp", 1, "kq", 2] },
        ])
        expect((yield* notes).filter((row) => row.startsWith("k"))).toEqual([
          "kp=1",
          "kq=2",
          "kr1=10",
          "kr2=20",
          "kr3=30",
          "kxs1=11",
          "kxs2=21",
          "kxs3=31",
        ])
      }),
    )

    it.effect("manyRows: every row written once with its own values, whatever the count's remainder", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        const R = SqliteWriter.ROWS_PER_INSERT
        for (const count of [0, 1, R - 1, R, R + 1, 2 * R, 2 * R + 7]) {
          const values: Array<SqliteWriter.SqlValue> = []
          for (let i = 0; i < count; i++) values.push(`zm${count}_${i}`, i, `zp${count}_${i}`)
          const runs = yield* w.transaction([
            {
              sql: "INSERT INTO notes (id, n) VALUES (?, ?)",
              width: 3,
              values,
              pick: [0, 1],
              manyRows: true,
            },
            {
              sql: "INSERT INTO notes (id, n) VALUES (? || 'x', ? * 2)",
              width: 3,
              values,
              pick: [2, 1],
              manyRows: true,
            },
          ])
          const rows = (yield* notes).filter(
            (row) => row.startsWith(`zm${count}_`) || row.startsWith(`zp${count}_`),
          )
          const expected: Array<string> = []
          for (let i = 0; i < count; i++) expected.push(`zm${count}_${i}=${i}`, `zp${count}_${i}x=${i * 2}`)
          expect([...rows].sort()).toEqual(expected.sort())
          // Full runs of R rows, then the rest one by one: per statement.
          expect(runs).toBe(2 * (Math.floor(count / R) + (count % R)))
        }
      }),
    )

    it.effect("manyRows: a table whose name ends in 'values' is split at its tuple", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE IF NOT EXISTS kv_values (k TEXT PRIMARY KEY, v INTEGER NOT NULL)`
        const w = yield* writer
        const values: Array<SqliteWriter.SqlValue> = []
        for (let i = 0; i < SqliteWriter.ROWS_PER_INSERT + 2; i++) values.push(`k${i}`, i)
        const runs = yield* w.transaction([
          { sql: "INSERT INTO kv_values (k, v) VALUES (?, ?)", width: 2, values, manyRows: true },
        ])
        expect(runs).toBe(3)
        const rows = yield* sql<{ n: number }>`SELECT COUNT(*) AS n FROM kv_values`
        expect(rows[0]?.n).toBe(SqliteWriter.ROWS_PER_INSERT + 2)
      }),
    )

    it.effect("manyRows: a duplicate inside a full run fails the transaction, nothing written", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        yield* w.transaction([insert("zdup2", 1)])
        const values: Array<SqliteWriter.SqlValue> = []
        for (let i = 0; i < 3 * SqliteWriter.ROWS_PER_INSERT; i++)
          values.push(i === SqliteWriter.ROWS_PER_INSERT + 5 ? "zdup2" : `zs${i}`, i)
        const exit = yield* Effect.exit(
          w.transaction([
            insert("zs_before", 1),
            { sql: "INSERT INTO notes (id, n) VALUES (?, ?)", width: 2, values, manyRows: true },
          ]),
        )
        expect(Exit.isFailure(exit)).toBe(true)
        expect((yield* notes).filter((row) => row.startsWith("zs") || row.startsWith("zdup2"))).toEqual([
          "zdup2=1",
        ])
      }),
    )

    it.effect("manyRows: a duplicate in a later run rolls back the rows of the runs before it", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        yield* w.transaction([insert("dup", 1)])
        const values: Array<SqliteWriter.SqlValue> = []
        for (let i = 0; i < 2 * SqliteWriter.ROWS_PER_INSERT + 3; i++) values.push(`zr${i}`, i)
        // The duplicate sits in the rows left over after the full runs.
        values.push("dup", 2)
        const exit = yield* Effect.exit(
          w.transaction([
            { sql: "INSERT INTO notes (id, n) VALUES (?, ?)", width: 2, values, manyRows: true },
          ]),
        )
        expect(Exit.isFailure(exit)).toBe(true)
        expect((yield* notes).filter((row) => row.startsWith("zr") || row.startsWith("dup"))).toEqual([
          "dup=1",
        ])
      }),
    )

    it.effect(
      "refuses a statement whose values are not whole rows, whose picks leave the row, or manyRows not on an INSERT … VALUES: nothing written",
      () =>
        Effect.gen(function* () {
          yield* setUp
          const w = yield* writer
          const sql = "INSERT INTO notes (id, n) VALUES (?, ?)"
          for (const bad of [
            { sql, width: 0, values: [] },
            { sql, width: 2, values: ["bad1", 1, "bad2"] },
            { sql, width: 2, values: ["bad3", 1], pick: [0, 2] },
            { sql: "UPDATE notes SET n = ? WHERE id = ?", width: 2, values: [1, "bad4"], manyRows: true },
            // Not one plain tuple the thread could repeat: something after it, parameters not plain `?`,
            // a parenthesis inside, or not one `?` per value bound.
            ...[
              "INSERT INTO notes (id, n) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET n = max(n, excluded.n)",
              "INSERT INTO notes (id, n) VALUES (?, ?) RETURNING id",
              "INSERT INTO notes (id, n) VALUES (?1, ?2)",
              "INSERT INTO notes (id, n) VALUES (:id, :n)",
              "INSERT INTO notes (id, n) VALUES (?, abs(?))",
              "INSERT INTO notes (id, n) VALUES (?, ? + ?)",
              "INSERT INTO notes (id, n) VALUES (?, 1)",
            ].map((text) => ({ sql: text, width: 2, values: ["bad5", 1], manyRows: true })),
          ]) {
            const exit = yield* Effect.exit(w.transaction([insert("bad0", 0), bad]))
            expect(Exit.isFailure(exit)).toBe(true)
          }
          expect((yield* notes).filter((row) => row.startsWith("bad"))).toEqual([])
        }),
    )

    it.effect("a failing statement rolls the whole transaction back", () =>
      Effect.gen(function* () {
        yield* setUp
        const w = yield* writer
        yield* w.transaction([insert("c", 1)])
        // "d" is written before the duplicate "c" fails: neither may stay.
        const exit = yield* Effect.exit(w.transaction([insert("d", 1), insert("c", 2)]))
        expect(Exit.isFailure(exit)).toBe(true)
        if (Exit.isFailure(exit)) expect(String(exit.cause)).toContain("SqlError")
        const rows = yield* notes
        expect(rows).toContain("c=1")
        expect(rows).not.toContain("d=1")
        expect(rows).not.toContain("c=2")
      }),
    )

    it.effect("the thread's writes and the main connection's writes interleave without a failure", () =>
      Effect.gen(function* () {
        yield* setUp
        const sql = yield* SqlClient.SqlClient
        const w = yield* writer
        const onThread = Effect.forEach(
          Array.from({ length: 50 }, (_, i) => i),
          (i) => w.transaction([insert(`t${String(i).padStart(3, "0")}`, i), insert(`u${i}`, i)]),
          { concurrency: "unbounded" },
        )
        const onMain = Effect.forEach(
          Array.from({ length: 50 }, (_, i) => i),
          (i) =>
            sql.withTransaction(
              Effect.zipRight(
                sql`INSERT INTO notes (id, n) VALUES (${`m${i}`}, ${i})`,
                sql`UPDATE notes SET n = n + 1 WHERE id = ${`m${i}`}`,
              ),
            ),
          { concurrency: 1 },
        )
        yield* Effect.all([onThread, onMain], { concurrency: "unbounded" })
        const rows = yield* notes
        expect(rows.filter((r) => r.startsWith("t"))).toHaveLength(50)
        expect(rows.filter((r) => r.startsWith("u"))).toHaveLength(50)
        expect(rows.filter((r) => r.startsWith("m"))).toHaveLength(50)
        expect(rows).toContain("m7=8")
      }),
    )
  })

  it.effect("a SQLite file has a writer thread; an in-memory database has none", () =>
    Effect.gen(function* () {
      const url = yield* TestDatabase.withTemporarySqliteFile("swarmgate_sqlite_writer_kinds")
      const onFile = yield* Effect.provide(SqliteWriter.SqliteWriter, yield* Layer.build(Database.layer(url)))
      const inMemory = yield* Effect.provide(
        SqliteWriter.SqliteWriter,
        yield* Layer.build(Database.layer("sqlite::memory:")),
      )
      expect(onFile).toBeDefined()
      expect(inMemory).toBeUndefined()
    }).pipe(Effect.scoped),
  )

  it.effect(
    "a thread that cannot open its file fails what waits as unavailable, and is not restarted at once",
    () =>
      Effect.gen(function* () {
        const w = yield* SqliteWriter.make("/nonexistent-swarmgate-dir/writer.db")
        for (let i = 0; i < 3; i++) {
          const exit = yield* Effect.exit(w.transaction([insert("z", i)]))
          expect(Exit.isFailure(exit)).toBe(true)
          if (Exit.isFailure(exit)) {
            const error = Cause.failureOption(exit.cause)
            expect(Option.isSome(error) && SqliteWriter.isUnavailable(error.value)).toBe(true)
          }
        }
      }).pipe(Effect.scoped),
  )

  it.effect("a transaction after the scope closed fails (the thread was stopped)", () =>
    Effect.gen(function* () {
      const url = yield* TestDatabase.withTemporarySqliteFile("swarmgate_sqlite_writer_closed")
      const w = yield* Effect.scoped(
        Effect.gen(function* () {
          const context = yield* Layer.build(Database.layer(url))
          const w = yield* Effect.provide(writer, context)
          yield* Effect.provide(setUp, context)
          yield* w.transaction([insert("x", 1)])
          return w
        }),
      )
      const exit = yield* Effect.exit(w.transaction([insert("y", 1)]))
      expect(Exit.isFailure(exit)).toBe(true)
    }).pipe(Effect.scoped),
  )
})
