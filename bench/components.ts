/**
 * What the pieces of swarmgate's request path cost on this machine, measured
 * alone (CPU time of this process per operation, `process.cpuUsage`): Effect
 * primitives the path uses per request or per streamed chunk, and the HTTP
 * node transport against raw clients. Explains the full-path numbers; it
 * measures the gateway's packages as they are and changes nothing.
 *
 *   node --import tsx bench/components.ts --upstream http://127.0.0.1:PORT   (prints JSON)
 */
import { randomUUID } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"
import { SqlClient } from "@effect/sql"
import { Ledger } from "@swarmgate/billing"
import { HttpTransport, type NodeRequest } from "@swarmgate/dispatch"
import { RequestId } from "@swarmgate/gateway"
import { Database } from "@swarmgate/store"
import { Chunk, Effect, Fiber, ManagedRuntime, Option, Stream } from "effect"
import { request as undiciRequest } from "undici"

const { values } = parseArgs({
  options: { upstream: { type: "string" }, scale: { type: "string", default: "1" } },
})
const scale = Number(values.scale)

export interface Component {
  readonly name: string
  readonly unit: string
  readonly cpuMicros: number
}

const results: Array<Component> = []

/** Runs `once` `n` times after a warm-up, and records CPU µs per run ÷ `per`. */
const measure = async (name: string, unit: string, n: number, per: number, once: () => Promise<unknown>) => {
  const count = Math.max(10, Math.round(n * scale))
  for (let i = 0; i < Math.max(5, count / 5); i++) await once()
  const before = process.cpuUsage()
  for (let i = 0; i < count; i++) await once()
  const used = process.cpuUsage(before)
  results.push({ name, unit, cpuMicros: Math.round(((used.user + used.system) / count / per) * 100) / 100 })
}

/** Runs `body` `n` times inside one fiber: the cost of `body` without a fiber start per run. */
const inFiber = (body: Effect.Effect<unknown, unknown>, n: number) =>
  Effect.runPromise(
    Effect.either(
      Effect.gen(function* () {
        for (let i = 0; i < n; i++) yield* body
      }),
    ),
  )

const OPS = 2000

const LEDGER_BATCH = 60

/**
 * The ledger's group commit on SQLite (`Ledger.writeBatch`, batches of 60 as at
 * ~3,000 requests/s), once 120,000 rows are written, with request ids made
 * one way or the other: the ids key the rows, so their order decides how many
 * B-tree pages each commit rewrites.
 */
const ledger = async (ids: string, requestId: () => string) => {
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-ledger-"))
  const runtime = ManagedRuntime.make(Database.layer(`sqlite:${join(dir, "ledger.db")}`))
  try {
    const now = Date.now()
    await runtime.runPromise(
      Effect.flatMap(SqlClient.SqlClient, (sql) =>
        Effect.zipRight(
          sql`INSERT INTO accounts (id, name, status, created_at, updated_at) VALUES ('acct_bench', 'bench', 'active', ${now}, ${now})`,
          sql`INSERT INTO api_keys (id, account_id, key_hash, prefix, created_at, updated_at) VALUES ('key_bench', 'acct_bench', 'hash', 'sk-swarm-ben', ${now}, ${now})`,
        ),
      ),
    )
    const batch = (): Array<Ledger.UsageEntry> =>
      Array.from({ length: LEDGER_BATCH }, () => ({
        requestId: requestId(),
        accountId: "acct_bench",
        keyId: "key_bench",
        model: "swarm-prime",
        promptTokens: 14,
        completionTokens: 20,
        costMicros: 40,
        holdMicros: 600,
        outcome: "completed",
        startedAt: now,
        createdAt: now,
      }))
    const write = () => runtime.runPromise(Ledger.writeBatch(batch()))
    for (let i = 0; i < Math.round(2_000 * scale); i++) await write()
    await measure(
      `ledger: SQLite group commit after ${Math.round(120 * scale)}k rows, ${ids} request ids`,
      "settled request",
      200,
      LEDGER_BATCH,
      write,
    )
  } finally {
    await runtime.dispose()
    rmSync(dir, { recursive: true, force: true })
  }
}

const main = async () => {
  await measure("Effect.runPromise(Effect.void): one fiber per request", "request", 20_000, 1, () =>
    Effect.runPromise(Effect.void),
  )
  await measure("Effect.fork + Fiber.join", "fork", 20, OPS, () =>
    inFiber(Effect.flatMap(Effect.fork(Effect.void), Fiber.join), OPS),
  )
  await measure("Effect.timeoutFail (30 s) around an immediate effect", "timeout", 20, OPS, () =>
    inFiber(Effect.timeoutFail(Effect.void, { duration: "30 seconds", onTimeout: () => "late" }), OPS),
  )
  await measure("Effect.scoped + acquireRelease", "scope", 20, OPS, () =>
    inFiber(Effect.scoped(Effect.acquireRelease(Effect.void, () => Effect.void)), OPS),
  )
  const elements = Array.from({ length: 200 }, (_, i) => i)
  const stream = (pipe: (s: Stream.Stream<number>) => Stream.Stream<number, unknown>) => () =>
    Effect.runPromise(
      Effect.either(Stream.runDrain(pipe(Stream.fromIterable(elements).pipe(Stream.rechunk(1))))),
    )
  await measure(
    "Stream: one element per chunk, runDrain",
    "element",
    100,
    200,
    stream((s) => s),
  )
  await measure(
    "Stream: + runForEach with an effect per element",
    "element",
    100,
    200,
    stream((s) => Stream.tap(s, () => Effect.void)),
  )
  await measure(
    "Stream: + Stream.timeoutFail (idle timeout)",
    "element",
    100,
    200,
    stream((s) => Stream.timeoutFail(s, () => "stalled", "30 seconds")),
  )
  await measure(
    "Stream: re-streamed through toPull + repeatEffectChunkOption",
    "element",
    100,
    200,
    stream((s) =>
      Stream.unwrapScoped(
        Effect.map(Stream.toPull(s), (pull) =>
          Stream.repeatEffectChunkOption(
            Effect.mapError(pull, (e) => (Option.isNone(e) ? Option.none() : Option.some(e.value))),
          ),
        ),
      ),
    ),
  )
  await measure(
    "Stream: mapChunks + takeUntil + mapEffect (the transport's decode stages)",
    "element",
    100,
    200,
    stream((s) =>
      s.pipe(
        Stream.mapChunks((c) => Chunk.map(c, (x) => x + 1)),
        Stream.takeUntil(() => false),
        Stream.mapEffect((x) => Effect.succeed(x)),
      ),
    ),
  )

  await ledger("random", () => `req_${randomUUID().replaceAll("-", "")}`)
  await ledger("time-ordered", RequestId.newRequestId)

  const upstream = values.upstream
  if (upstream !== undefined) {
    const body = (chunks: number) =>
      JSON.stringify({
        model: "instant",
        messages: [{ role: "user", content: `chunks=${chunks}` }],
        stream: true,
        max_tokens: 256,
      })
    for (const chunks of [20, 200]) {
      const text = body(chunks)
      await measure(`undici.request + read the SSE body (${chunks} chunks)`, "request", 2000, 1, async () => {
        const response = await undiciRequest(`${upstream}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: text,
        })
        await response.body.text()
      })
      await measure(`fetch + read the SSE body (${chunks} chunks)`, "request", 1000, 1, async () => {
        const response = await fetch(`${upstream}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: text,
        })
        await response.text()
      })
      const node = HttpTransport.make({ id: "instant", url: upstream, models: new Map(), capacity: 1000 })
      const request: NodeRequest = {
        requestId: "req_bench",
        model: "instant",
        messages: [{ role: "user", content: `chunks=${chunks}`, images: [] }],
        maxTokens: 256,
        jsonMode: false,
        sampling: {},
      }
      await measure(
        `swarmgate HttpTransport.generate, drained (${chunks} chunks)`,
        "request",
        chunks === 20 ? 500 : 200,
        1,
        () => Effect.runPromise(Stream.runDrain(node.generate(request))),
      )
    }
  }
  console.log(JSON.stringify(results))
}

void main()
