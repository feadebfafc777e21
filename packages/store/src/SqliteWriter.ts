/**
 * A second connection to a SQLite file, on a worker thread, for the writes
 * that must not stall the event loop: the ledger's group commits. better-sqlite3
 * is synchronous, so on the main connection each batch (three statements over
 * ~100 rows, and now and then a WAL checkpoint with its fsync) held every
 * request for 1–2 ms, 20 times a second: about what the gateway's p99 latency
 * at one connection exceeded its goal by.
 *
 * Each transaction is `BEGIN IMMEDIATE` … `COMMIT` on the thread: all of its
 * statements or none. Both connections wait for each other's write lock
 * (better-sqlite3's 5 s busy timeout); a reader never waits (WAL). A
 * transaction on the main connection that reads before it writes can fail
 * with SQLITE_BUSY_SNAPSHOT when this thread committed in between, so such
 * transactions write first (Repository.addCredit).
 *
 * The main connection waits for the thread's lock inside SQLite's busy
 * handler, on the event loop (sleeps of 1, 2, 5, 10… ms): only admin and
 * lifecycle writes go there, never a chat completion's.
 *
 * Only for files: an in-memory database is private to its connection, so it
 * has no writer (`SqliteWriter` is then `undefined`, and callers write on
 * the main connection). The thread starts at the first transaction and stops
 * with the layer's scope. A thread that cannot start or dies fails what
 * waits with `WriterUnavailable`, is logged once, and is not started again
 * for `RESTART_MILLIS`: callers then write on the main connection. An
 * interrupted `transaction` is not taken back: it commits or fails on its own.
 */
import { createRequire } from "node:module"
import { resolve } from "node:path"
import { Worker } from "node:worker_threads"
import { SqlError } from "@effect/sql/SqlError"
import { Context, Data, Effect, Layer, type Scope } from "effect"

/** The cause of a transaction's `SqlError` when the thread, not a statement, failed: nothing was written. */
export class WriterUnavailable extends Data.TaggedError("WriterUnavailable")<{ readonly reason: string }> {
  override get message() {
    return `the SQLite writer thread is unavailable: ${this.reason}`
  }
}

/** Whether `error` is a transaction that the thread never ran (`WriterUnavailable`). */
export const isUnavailable = (error: SqlError): boolean => error.cause instanceof WriterUnavailable

/** What a statement binds: values a worker message carries as they are. */
export type SqlValue = string | number | bigint | null

/**
 * A statement, run once per `width` values of `values` (prepared once: a row
 * costs a run, not a parse; with `manyRows`, up to `ROWS_PER_INSERT` rows a
 * run). The values are one flat array, not an array per
 * run: a message to the thread copies each object it holds, and a batch's
 * rows were most of the event loop's cost of posting it. Two statements may
 * share one array (it is copied once): `pick` then says which of each run's
 * values this one binds, in its order.
 */
export interface Statement {
  readonly sql: string
  readonly width: number
  readonly values: ReadonlyArray<SqlValue>
  readonly pick?: ReadonlyArray<number> | undefined
  /**
   * `sql` is an INSERT that ends in one row's `VALUES (…)`: the thread then
   * inserts up to `ROWS_PER_INSERT` rows per run, that row's tuple repeated —
   * one run's fixed cost (the call into SQLite, the statement's step and
   * reset) shared by that many rows: ~35 % less per ledger entry, measured
   * alone on the ledger's tables. The tuple must be the statement's last
   * parenthesis, with no parenthesis inside it and one plain `?` per bound
   * value (nothing after it: no upsert, no RETURNING; no numbered or named
   * parameters); anything else is refused.
   */
  readonly manyRows?: boolean | undefined
}

/** Rows per run of a `manyRows` INSERT (16 to 32 measured best; 10 values a row stay far under SQLite's 32,766 variables). */
export const ROWS_PER_INSERT = 32

export interface SqliteWriterShape {
  /** Runs the statements in one immediate transaction on the writer thread; succeeds with the statement runs it took. */
  readonly transaction: (statements: ReadonlyArray<Statement>) => Effect.Effect<number, SqlError>
}

/** The writer of the database in context; `undefined` (the default) when there is none. */
export class SqliteWriter extends Context.Reference<SqliteWriter>()("@swarmgate/store/SqliteWriter", {
  defaultValue: (): SqliteWriterShape | undefined => undefined,
}) {}

/**
 * The thread's program (CommonJS, run with `eval`, so that it needs no file of
 * its own beside the bundle): statements prepared once per text (callers use
 * a fixed few), one transaction per message, the answer posted with the
 * message's id.
 */
const WRITER_PROGRAM = `
const { parentPort, workerData } = require("node:worker_threads")
// Linux only: there it applies to this thread; elsewhere it would lower the whole process.
if (process.platform === "linux") {
  try { require("node:os").setPriority(0, workerData.nice) } catch {}
}
const Sqlite = require(workerData.driver)
const db = new Sqlite(workerData.filename)
db.pragma("synchronous = NORMAL")
const prepared = new Map()
const prepare = (sql) => {
  let statement = prepared.get(sql)
  if (statement === undefined) {
    statement = db.prepare(sql)
    prepared.set(sql, statement)
  }
  return statement
}
// The same INSERT with its one VALUES tuple repeated: that many rows per run. The tuple is from the
// statement's last parenthesis on (the main thread refused any other shape).
const prepareMany = (sql, rows) => {
  const key = rows + "\u0000" + sql
  let statement = prepared.get(key)
  if (statement === undefined) {
    const at = sql.lastIndexOf("(")
    statement = db.prepare(sql.slice(0, at) + new Array(rows).fill(sql.slice(at)).join(","))
    prepared.set(key, statement)
  }
  return statement
}
let runs = 0
const run = db.transaction((statements) => {
  for (const { sql, width, values, pick, manyRows } of statements) {
    const bound = pick === undefined ? width : pick.length
    const rows = values.length / width
    let row = 0
    // Rows [from, from + count) into params, each row's bound values in order.
    const fill = (params, from, count) => {
      let p = 0
      for (let at = from * width, end = (from + count) * width; at < end; at += width) {
        if (pick === undefined) for (let i = 0; i < width; i++) params[p++] = values[at + i]
        else for (let i = 0; i < bound; i++) params[p++] = values[at + pick[i]]
      }
      return params
    }
    if (manyRows === true && rows >= workerData.rowsPerInsert) {
      const many = prepareMany(sql, workerData.rowsPerInsert)
      const params = new Array(bound * workerData.rowsPerInsert)
      for (; row + workerData.rowsPerInsert <= rows; row += workerData.rowsPerInsert) {
        many.run(fill(params, row, workerData.rowsPerInsert))
        runs++
      }
    }
    const statement = prepare(sql)
    const params = new Array(bound)
    for (; row < rows; row++) {
      statement.run(fill(params, row, 1))
      runs++
    }
  }
})
parentPort.on("message", ({ id, statements }) => {
  try {
    runs = 0
    run.immediate(statements)
    parentPort.postMessage({ id, runs })
  } catch (error) {
    parentPort.postMessage({ id, error: { message: String(error && error.message), code: error && error.code } })
  }
})
`

interface Answer {
  readonly id: number
  /** Statement runs the transaction took. */
  readonly runs?: number | undefined
  readonly error?: { readonly message: string; readonly code: unknown } | undefined
}

/**
 * The writer thread's niceness: where it and the event loop want the same core (one
 * core, as in the bench's `taskset`), the scheduler gives the event loop the larger
 * share (~90 % against nice 10); a spare core is the thread's own. Not 19: beside a
 * saturated event loop it would get ~1.5 % of the core, less than the ledger needs.
 */
const WRITER_NICE = 10

/** After the thread was lost, how long transactions fail at once instead of starting another. */
export const RESTART_MILLIS = 30_000

/** An INSERT ending in one VALUES tuple with no parenthesis inside: what a `manyRows` statement repeats. */
const ENDS_IN_TUPLE = /^\s*INSERT\b[\s\S]*\bVALUES\s*\(([^()]*)\)\s*$/i
/** SQLite's parameter forms other than a plain `?`. */
const OTHER_PARAMETERS = /\?\d|[:@$][A-Za-z_]/

/** SQLite's default most variables in one statement. */
const MAX_VARIABLES = 32_766

/**
 * `manyRows` only where the thread can repeat the tuple: the statement's last
 * parenthesis opens it (as the thread splits it), and it binds exactly one
 * plain `?` per value bound.
 */
const repeatable = (sql: string, bound: number): boolean => {
  const tuple = ENDS_IN_TUPLE.exec(sql)?.[1]
  if (tuple === undefined || OTHER_PARAMETERS.test(tuple)) return false
  let marks = 0
  for (let i = 0; i < tuple.length; i++) if (tuple.charCodeAt(i) === 63) marks++
  return marks === bound && bound * ROWS_PER_INSERT <= MAX_VARIABLES
}

/** Whole rows of a positive width, picks that stay inside a row, and `manyRows` only where `repeatable`. */
const wellFormed = ({ sql, width, values, pick, manyRows }: Statement): boolean =>
  Number.isInteger(width) &&
  width > 0 &&
  values.length % width === 0 &&
  (pick === undefined || pick.every((i) => Number.isInteger(i) && i >= 0 && i < width)) &&
  (manyRows !== true || repeatable(sql, pick === undefined ? width : pick.length))

const failure = (cause: unknown) => new SqlError({ cause, message: "Failed to execute statement" })

const unavailable = (reason: string) =>
  new SqlError({
    cause: new WriterUnavailable({ reason }),
    message: "The SQLite writer thread is unavailable",
  })

/** A writer for the SQLite file `filename`; its thread stops when the scope closes. */
export const make = (filename: string): Effect.Effect<SqliteWriterShape, never, Scope.Scope> =>
  Effect.gen(function* () {
    const driver = createRequire(import.meta.url).resolve("better-sqlite3")
    // The thread starts later, perhaps after a change of directory.
    const path = resolve(filename)
    const waiting = new Map<number, (result: Effect.Effect<number, SqlError>) => void>()
    let nextId = 0
    let thread: Worker | undefined
    let closed = false
    /** Set when the thread was lost: no new one before this time; the reason, until logged. */
    let downUntil = 0
    let unlogged: string | undefined

    /** Every waiting transaction fails; the next start waits `RESTART_MILLIS`. */
    const failWaiting = (worker: Worker, cause: unknown) => {
      if (thread !== worker) return
      thread = undefined
      const reason = cause instanceof Error ? cause.message : String(cause)
      if (!closed) {
        downUntil = Date.now() + RESTART_MILLIS
        unlogged = reason
      }
      const answers = [...waiting.values()]
      waiting.clear()
      for (const resume of answers) resume(Effect.fail(unavailable(reason)))
    }

    const start = (): Worker => {
      const worker = new Worker(WRITER_PROGRAM, {
        eval: true,
        workerData: { filename: path, driver, nice: WRITER_NICE, rowsPerInsert: ROWS_PER_INSERT },
      })
      worker.on("message", (answer: Answer) => {
        const resume = waiting.get(answer.id)
        if (resume === undefined) return
        waiting.delete(answer.id)
        // Idle, the thread must not keep the process alive.
        if (waiting.size === 0) worker.unref()
        resume(
          answer.error === undefined ? Effect.succeed(answer.runs ?? 0) : Effect.fail(failure(answer.error)),
        )
      })
      worker.on("error", (error) => failWaiting(worker, error))
      worker.on("exit", (code) => failWaiting(worker, new Error(`the thread exited (${code})`)))
      worker.unref()
      return worker
    }

    yield* Effect.addFinalizer(() =>
      Effect.promise(async () => {
        closed = true
        // Its exit fails whatever still waits (`failWaiting`).
        if (thread !== undefined) await thread.terminate()
      }),
    )

    const transaction = (statements: ReadonlyArray<Statement>): Effect.Effect<number, SqlError> =>
      Effect.async<number, SqlError>((resume) => {
        const malformed = statements.find((statement) => !wellFormed(statement))
        // The thread would loop on a width of 0, or drop a partial row: refused here, nothing written.
        if (malformed !== undefined)
          return resume(Effect.fail(failure(new Error(`malformed statement: ${malformed.sql}`))))
        if (closed) return resume(Effect.fail(unavailable("closed")))
        if (unlogged !== undefined) {
          const reason = unlogged
          unlogged = undefined
          return resume(
            Effect.zipRight(
              Effect.logWarning(
                `SQLite writer thread lost (${reason}); ledger batches go to the main connection for ${RESTART_MILLIS / 1000} s`,
              ),
              Effect.fail(unavailable(reason)),
            ),
          )
        }
        if (thread === undefined && Date.now() < downUntil)
          return resume(Effect.fail(unavailable("restarting later")))
        thread ??= start()
        const id = nextId++
        if (waiting.size === 0) thread.ref()
        waiting.set(id, resume)
        thread.postMessage({ id, statements })
      })

    return { transaction }
  })

/** `SqliteWriter` for the SQLite file `filename`. */
export const layer = (filename: string): Layer.Layer<SqliteWriter> =>
  Layer.scoped(SqliteWriter, make(filename))
