/**
 * Readiness: can this instance serve chat completions right now? The
 * database answers `SELECT 1`, Redis (when configured) answers `PING`, and
 * at least one node is active with a circuit that admits traffic. Each check
 * has a one-second budget. `/healthz` is liveness only (the process answers);
 * `/readyz` runs these checks and turns 503 the moment a drain starts.
 *
 * A background probe runs the same dependency checks every `probeMillis` and
 * feeds the latency metrics, so scrapes never wait on a dependency.
 */
import { performance } from "node:perf_hooks"
import { SqlClient } from "@effect/sql"
import { Dispatcher } from "@swarmgate/dispatch"
import { Redis as R } from "@swarmgate/store"
import { Cause, Context, Effect, Layer, Option, type Redacted, Schedule } from "effect"
import type { Redis } from "ioredis"
import { Metrics } from "./Metrics"

export interface Check {
  readonly ok: boolean
  readonly latency_ms?: number
  readonly error?: string
}

export interface Readiness {
  readonly ready: boolean
  readonly checks: {
    readonly database: Check
    readonly redis?: Check
    readonly nodes: { readonly ok: boolean; readonly healthy: number; readonly total: number }
  }
}

export interface HealthShape {
  readonly readiness: Effect.Effect<Readiness>
}

export class Health extends Context.Tag("@swarmgate/gateway/Health")<Health, HealthShape>() {}

const BUDGET_MILLIS = 1_000

const describe = (cause: Cause.Cause<unknown>) => {
  const error = Cause.squash(cause)
  return String((error as Error)?.message ?? error).slice(0, 200)
}

const timed = <E>(effect: Effect.Effect<unknown, E>): Effect.Effect<Check> =>
  Effect.suspend(() => {
    const start = performance.now()
    return effect.pipe(
      Effect.timeoutFail({ duration: BUDGET_MILLIS, onTimeout: () => new Error("no answer within 1 s") }),
      Effect.map(
        (): Check => ({ ok: true, latency_ms: Math.round((performance.now() - start) * 100) / 100 }),
      ),
      Effect.catchAllCause((cause) => Effect.succeed<Check>({ ok: false, error: describe(cause) })),
    )
  })

export interface HealthOptions {
  readonly redisUrl: Option.Option<Redacted.Redacted>
  /** Dependency probe for the latency metrics; 0 disables it. */
  readonly probeMillis?: number | undefined
}

export const layer = (
  options: HealthOptions,
): Layer.Layer<Health, never, SqlClient.SqlClient | Dispatcher.Dispatcher> =>
  Layer.scoped(
    Health,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const dispatcher = yield* Dispatcher.Dispatcher
      const metrics = yield* Effect.serviceOption(Metrics)
      const redis: Redis | undefined = Option.isSome(options.redisUrl)
        ? yield* R.connect(options.redisUrl.value, BUDGET_MILLIS)
        : undefined

      const database = timed(sql`SELECT 1`)
      const redisCheck = redis === undefined ? undefined : timed(R.command(() => redis.ping()))
      const nodes = Effect.map(dispatcher.status, (all) => {
        const healthy = all.filter((n) => n.state === "active" && n.circuit !== "open").length
        return { ok: healthy > 0, healthy, total: all.length }
      })

      const record = (name: "database" | "redis", check: Check) => {
        if (Option.isSome(metrics)) metrics.value.dependency(name, (check.latency_ms ?? 0) / 1000, check.ok)
      }

      const readiness = Effect.gen(function* () {
        const [db, rd, nd] = yield* Effect.all([database, redisCheck ?? Effect.succeed(undefined), nodes], {
          concurrency: "unbounded",
        })
        record("database", db)
        if (rd !== undefined) record("redis", rd)
        return {
          ready: db.ok && (rd?.ok ?? true) && nd.ok,
          checks: rd === undefined ? { database: db, nodes: nd } : { database: db, redis: rd, nodes: nd },
        }
      })

      const probeMillis = options.probeMillis ?? 5_000
      if (probeMillis > 0 && Option.isSome(metrics)) {
        const probe = Effect.gen(function* () {
          record("database", yield* database)
          if (redisCheck !== undefined) record("redis", yield* redisCheck)
        })
        yield* Effect.forkScoped(Effect.repeat(probe, Schedule.spaced(probeMillis)))
      }
      return { readiness }
    }),
  )
