/**
 * The gateway's own infrastructure failing under it, injected by TCP fault
 * proxies between the gateway process and Redis, PostgreSQL and two node-sim
 * processes (cut, stall, latency). Each scenario checks the documented policy
 * as a client sees it, and afterwards that nothing leaked: every hold
 * resolved, every slot released, every node idle, and — at the end —
 * `swarmgate ledger check` passes with exactly one usage record per request
 * that ran (none for refused ones).
 */
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { RedisStore } from "@swarmgate/quota"
import { Redis, TestDatabase } from "@swarmgate/store"
import { Effect } from "effect"
import {
  eventually,
  expectLedgerConsistent,
  NO_LIMITS,
  temporaryPgDatabase,
  type UsageView,
  usageOf,
} from "./support/Billing"
import { type FaultProxy, startFaultProxy } from "./support/FaultProxy"
import { type NodeSimProcess, nodesOf, startNodeSim } from "./support/NodeSimProcess"
import { expectRefusal } from "./support/RawHttp"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

const redisUrl = process.env.TEST_REDIS_URL?.trim() || undefined
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
const missing = [
  TestDatabase.pgAvailable ? undefined : "TEST_DATABASE_URL",
  redisUrl === undefined ? "TEST_REDIS_URL" : undefined,
].filter((x) => x !== undefined)
if (missing.length > 0 && !required)
  console.warn(`[skipped] infrastructure fault tests: ${missing.join(", ")} missing`)

const LEASE = 1_000
/** The billing book's hold sweep (its default): a lapsed hold's money is back within a lease and a sweep. */
const SWEEP = 5_000
const IDLE_TIMEOUT = 1_000
const FIRST_TOKEN_TIMEOUT = 1_000
/** Streams long enough (60 tokens/s) that a fault finds them running. */
const SIM = ["--capacity", "16", "--ttft-ms", "30", "--ttft-jitter", "0", "--tokens-per-second", "60"]
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

const SHORT = [{ role: "user", content: "Name a river." }]
const LONG = [
  { role: "user", content: "Explain in great detail how rivers carve valleys, with many examples." },
]

interface Outcome {
  readonly requestId: string
  readonly status: number
  /** `done` ([DONE] after the last chunk), `error` (the final upstream_error event), `cut` (neither), `json` */
  readonly ending: "done" | "error" | "cut" | "json"
  readonly code: string | undefined
  readonly millis: number
}

describe.skipIf(missing.length > 0 && !required)("infrastructure faults", () => {
  const prefix = `test:faults:${randomBytes(6).toString("hex")}:`
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-faults-"))
  let database: Awaited<ReturnType<typeof temporaryPgDatabase>>
  let pg: FaultProxy
  let redis: FaultProxy
  let nodeA: FaultProxy
  let nodeB: FaultProxy
  let simA: NodeSimProcess
  let simB: NodeSimProcess
  let server: RunningServer
  let key: string
  let accountId: string
  /** Request ids that ran on a node (a usage record is due), and those refused before (none is). */
  const ran = new Map<string, string>()
  const refused = new Set<string>()
  /** Ran while Redis was away: their settlement may lapse (under-charge, never over-charge). */
  const mayLapse = new Set<string>()

  beforeAll(async () => {
    if (missing.length > 0)
      throw new Error(`fault tests need ${missing.join(", ")} (SWARMGATE_REQUIRE_SERVICES=1)`)
    database = await temporaryPgDatabase("swarmgate_faults")
    const pgTarget = new URL(TestDatabase.pgUrl!)
    const redisTarget = new URL(redisUrl!)
    ;[pg, redis, simA, simB] = await Promise.all([
      startFaultProxy({ host: pgTarget.hostname, port: Number(pgTarget.port || 5432) }),
      startFaultProxy({ host: redisTarget.hostname, port: Number(redisTarget.port || 6379) }),
      startNodeSim(["--nodes", "2", "--seed", "11", "--id-prefix", "a-", ...SIM]),
      startNodeSim(["--nodes", "2", "--seed", "12", "--id-prefix", "b-", ...SIM]),
    ])
    ;[nodeA, nodeB] = await Promise.all([
      startFaultProxy({ host: "127.0.0.1", port: simA.port }),
      startFaultProxy({ host: "127.0.0.1", port: simB.port }),
    ])
    const nodesFile = join(dir, "nodes.json")
    const entry = (proxy: FaultProxy) => (n: NodeSimProcess["nodes"][number]) => ({
      id: n.id,
      url: proxy.rewrite(n.url),
      capacity: n.capacity,
      vision: n.vision,
      models: { "swarm-prime": n.id, "swarm-swift": n.id },
    })
    writeFileSync(
      nodesFile,
      JSON.stringify([...simA.nodes.map(entry(nodeA)), ...simB.nodes.map(entry(nodeB))]),
    )
    server = await startServer({
      DATABASE_URL: pg.rewrite(database.url),
      REDIS_URL: redis.rewrite(redisUrl!),
      SWARMGATE_REDIS_PREFIX: prefix,
      SWARMGATE_LEASE_MS: String(LEASE),
      SWARMGATE_NODES_FILE: nodesFile,
      SWARMGATE_IDLE_TIMEOUT_MS: String(IDLE_TIMEOUT),
      SWARMGATE_FIRST_TOKEN_TIMEOUT_MS: String(FIRST_TOKEN_TIMEOUT),
      SWARMGATE_NODE_CONNECT_TIMEOUT_MS: "1000",
      SWARMGATE_HEDGE_MS: "0",
      SWARMGATE_PROBE_INTERVAL_MS: "250",
      SWARMGATE_CIRCUIT_OPEN_MS: "500",
    })
    ;({ key, accountId } = await createKey(server, { balance_usd: 100, limits: NO_LIMITS }))
  }, 60_000)

  afterAll(async () => {
    await server?.stop()
    await Promise.all([simA?.stop(), simB?.stop()])
    await Promise.all([pg, redis, nodeA, nodeB].map((p) => p?.close()))
    await database?.drop()
    if (redisUrl !== undefined) await Effect.runPromise(RedisStore.reset({ url: redisUrl, prefix }))
    rmSync(dir, { recursive: true, force: true })
  }, 30_000)

  /** One chat completion read to its end, with how it ended and how long it took. */
  const chat = async (body: Record<string, unknown>, withKey = key): Promise<Outcome> => {
    const started = Date.now()
    const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${withKey}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "swarm-prime", messages: SHORT, max_tokens: 20, ...body }),
    })
    const requestId = response.headers.get("x-request-id") ?? ""
    const text = await response.text().catch(() => "")
    const millis = Date.now() - started
    if (response.status !== 200) {
      const code = expectRefusal(response.status, Object.fromEntries(response.headers.entries()), text)
      // 502 after a node broke a non-streamed answer has run; before the first token it has not.
      return { requestId, status: response.status, ending: "json", code, millis }
    }
    // The main account's requests are tracked; other keys belong to other accounts.
    if (withKey === key) ran.set(requestId, expect.getState().currentTestName ?? "")
    if (!(response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
      return { requestId, status: 200, ending: "json", code: undefined, millis }
    }
    const events = text.split("\n\n").filter((e) => e.startsWith("data: "))
    const last = events.at(-1)
    const ending =
      last === "data: [DONE]"
        ? "done"
        : last !== undefined &&
            (JSON.parse(last.slice(6)) as { error?: { code?: string } }).error?.code === "upstream_error"
          ? "error"
          : "cut"
    return { requestId, status: 200, ending, code: undefined, millis }
  }

  /** Opens streams and resolves once each has sent its first content, with their endings still to come. */
  const openStreams = async (count: number) => {
    const streams = await Promise.all(
      Array.from({ length: count }, async () => {
        const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "swarm-prime", messages: LONG, max_tokens: 200, stream: true }),
        })
        expect(response.status).toBe(200)
        const requestId = response.headers.get("x-request-id") ?? ""
        ran.set(requestId, expect.getState().currentTestName ?? "")
        const reader = response.body!.getReader()
        const decoder = new TextDecoder()
        let text = ""
        while ((text.match(/"content":"[^"]/g) ?? []).length < 2) {
          const { value, done } = await reader.read()
          if (done) break
          text += decoder.decode(value, { stream: true })
        }
        const rest = (async () => {
          try {
            while (true) {
              const { value, done } = await reader.read()
              if (done) break
              text += decoder.decode(value, { stream: true })
            }
          } catch {
            // A connection the gateway dropped: counted as "cut" below.
          }
          const events = text.split("\n\n").filter((e) => e.startsWith("data: "))
          const last = events.at(-1)
          if (last === "data: [DONE]") return "done" as const
          if (last?.includes('"upstream_error"')) return "error" as const
          return "cut" as const
        })()
        return { requestId, ending: rest }
      }),
    )
    return streams
  }

  /** Nothing held, nothing running, nothing queued, every node idle. */
  const expectReleased = async (millis = SWEEP + 2 * LEASE + 3_000) => {
    let last: unknown
    await eventually(async () => {
      const account = (await server.admin("GET", `/accounts/${accountId}`)).body as {
        held_usd: number
        usage_now?: { concurrency: number; queued: number }
      }
      const nodes = await nodesOf(server)
      last = {
        held: account.held_usd,
        usage_now: account.usage_now,
        in_flight: nodes.map((n) => n.in_flight),
      }
      return (
        account.held_usd === 0 &&
        account.usage_now?.concurrency === 0 &&
        account.usage_now.queued === 0 &&
        nodes.every((n) => n.in_flight === 0)
      )
    }, millis).catch(async (e) => {
      throw new Error(
        `not released: ${JSON.stringify(last)} (${e})\n${await holdsInRedis()}\n${serverLogTail()}`,
      )
    })
  }

  /** The open holds in the shared book with their due times, for a failure's message. */
  const holdsInRedis = () =>
    Effect.runPromise(
      Effect.scoped(
        Effect.flatMap(Redis.connect(redisUrl!, 1_000), (client) =>
          Redis.command(() =>
            Promise.all([
              client.zrange(`${prefix}{billing}:hx`, 0, -1, "WITHSCORES"),
              client.hgetall(`${prefix}{billing}:h`),
            ]),
          ),
        ),
      ).pipe(
        Effect.match({
          onSuccess: ([due, holds]) =>
            `holds in Redis at ${Date.now()}: due ${JSON.stringify(due)}, holds ${JSON.stringify(holds)}`,
          onFailure: (e) => `holds in Redis: unreadable (${e.reason})`,
        }),
      ),
    )
  const serverLogTail = () => `server log (tail):\n${server.output().split("\n").slice(-40).join("\n")}`

  /** Every request that ran so far has its usage record. */
  const ledgerCaughtUp = () =>
    eventually(async () => {
      const have = new Set((await usageOf(server, accountId)).map((r) => r.request_id))
      return [...ran.keys()].every((id) => mayLapse.has(id) || have.has(id))
      // A batch whose claim was caught by an earlier fault is written after the claim timeout (30 s).
    }, 40_000)

  const healthy = async () => {
    const outcome = await chat({})
    expect(outcome.status).toBe(200)
  }

  describe("nodes", () => {
    it("cut mid-stream: streams on the cut node end with the final upstream_error event; new requests go to the other node", async () => {
      const streams = await openStreams(8)
      nodeA.set("cut")
      const started = Date.now()
      const endings = await Promise.all(streams.map((s) => s.ending))
      expect(Date.now() - started).toBeLessThan(IDLE_TIMEOUT + 3_000)
      // Never a silent truncation: every stream ends with [DONE] or the error event.
      expect(endings.filter((e) => e === "cut")).toEqual([])
      expect(endings).toContain("error")
      // While A is cut, requests are retried on B before the first token: all served.
      const during = await Promise.all(Array.from({ length: 8 }, () => chat({ stream: true })))
      expect(during.map((o) => `${o.status}:${o.ending}`)).toEqual(Array(8).fill("200:done"))
      nodeA.set("pass")
      await expectReleased()
    }, 30_000)

    it("stall mid-stream: a silent stream ends with upstream_error after the idle timeout", async () => {
      const streams = await openStreams(6)
      nodeA.set("stall")
      nodeB.set("stall")
      const started = Date.now()
      const endings = await Promise.all(streams.map((s) => s.ending))
      const took = Date.now() - started
      nodeA.set("pass")
      nodeB.set("pass")
      expect(endings).toEqual(Array(6).fill("error"))
      expect(took).toBeGreaterThanOrEqual(IDLE_TIMEOUT - 100)
      expect(took).toBeLessThan(IDLE_TIMEOUT + 2_500)
      await expectReleased()
    }, 30_000)

    it("every node cut or stalled before the first token: 429 capacity_exhausted, uncharged, in bounded time", async () => {
      nodeA.set("cut")
      nodeB.set("stall")
      const outcomes = await Promise.all(Array.from({ length: 4 }, (_, i) => chat({ stream: i % 2 === 0 })))
      nodeA.set("pass")
      nodeB.set("pass")
      for (const o of outcomes) {
        // Nothing was generated (every attempt failed, or every circuit is open already): 429, uncharged.
        expect(`${o.status}:${o.code}`).toBe("429:capacity_exhausted")
        // Attempts × the first-token timeout at worst.
        expect(o.millis).toBeLessThan(3 * FIRST_TOKEN_TIMEOUT + 2_000)
        refused.add(o.requestId)
      }
      await expectReleased()
      // The circuits close again once the nodes answer probes.
      await eventually(async () => (await nodesOf(server)).every((n) => n.circuit === "closed"), 8_000)
      await healthy()
    }, 30_000)

    it("latency on every node: served, just slower", async () => {
      nodeA.set("latency", { latencyMillis: 40 })
      nodeB.set("latency", { latencyMillis: 40 })
      const outcomes = await Promise.all(Array.from({ length: 6 }, (_, i) => chat({ stream: i % 2 === 0 })))
      nodeA.set("pass")
      nodeB.set("pass")
      expect(outcomes.map((o) => o.status)).toEqual(Array(6).fill(200))
      expect(outcomes.filter((o) => o.ending === "error" || o.ending === "cut")).toEqual([])
      await expectReleased()
    }, 30_000)
  })

  describe("Redis", () => {
    it("latency: served", async () => {
      redis.set("latency", { latencyMillis: 20 })
      const outcomes = await Promise.all(Array.from({ length: 4 }, () => chat({})))
      redis.set("pass")
      expect(outcomes.map((o) => o.status)).toEqual([200, 200, 200, 200])
      await expectReleased()
    }, 30_000)

    it("cut: chat completions get 503 admission_unavailable at once; models and admin keep working; all is released after", async () => {
      const streams = await openStreams(4)
      redis.set("cut")
      const started = Date.now()
      const refusals = await Promise.all(Array.from({ length: 6 }, () => chat({})))
      for (const o of refusals) {
        expect({ status: o.status, code: o.code }).toEqual({ status: 503, code: "admission_unavailable" })
        refused.add(o.requestId)
      }
      expect(Date.now() - started).toBeLessThan(2_500)
      const models = await fetch(`${server.baseUrl}/v1/models`, {
        headers: { authorization: `Bearer ${key}` },
      })
      expect(models.status).toBe(200)
      expect((await server.admin("GET", `/accounts/${accountId}`)).status).toBe(200)
      // Streams already running are not Redis's to stop.
      const endings = await Promise.all(streams.map((s) => s.ending))
      expect(endings.filter((e) => e === "cut")).toEqual([])
      for (const s of streams) mayLapse.add(s.requestId)
      redis.set("pass")
      await eventually(async () => (await chat({})).status === 200, 10_000)
      await expectReleased()
    }, 40_000)

    it("stall: refused within the command timeout, not left hanging", async () => {
      redis.set("stall")
      const outcomes = await Promise.all(Array.from({ length: 4 }, () => chat({})))
      redis.set("pass")
      for (const o of outcomes) {
        expect({ status: o.status, code: o.code }).toEqual({ status: 503, code: "admission_unavailable" })
        expect(o.millis).toBeLessThan(3_000)
        refused.add(o.requestId)
      }
      await eventually(async () => (await chat({})).status === 200, 10_000)
      await expectReleased()
    }, 30_000)
  })

  describe("PostgreSQL", () => {
    it("cut: a known key keeps working, an unknown one gets 503; charges are written once it is back", async () => {
      await healthy()
      const fresh = (await createKey(server, { balance_usd: 5, limits: NO_LIMITS })).key
      // A cut in the middle of a ledger write delays that batch by the 30 s claim timeout (reported):
      // the fault starts between writes.
      await ledgerCaughtUp()
      pg.set("cut")
      await sleep(200)
      const known = await Promise.all(Array.from({ length: 4 }, () => chat({})))
      expect(known.map((o) => o.status)).toEqual([200, 200, 200, 200])
      const unknownKey = await chat({}, fresh)
      expect({ status: unknownKey.status, code: unknownKey.code }).toEqual({
        status: 503,
        code: "admission_unavailable",
      })
      expect(unknownKey.millis).toBeLessThan(3_000)
      refused.add(unknownKey.requestId)
      pg.set("pass")
      await eventually(async () => (await chat({}, fresh)).status === 200, 10_000)
      await expectReleased()
    }, 75_000)

    it("stall: lookups give up with 503 in bounded time; known keys keep working; charges are written after", async () => {
      await healthy()
      const fresh = (await createKey(server, { balance_usd: 5, limits: NO_LIMITS })).key
      await ledgerCaughtUp()
      pg.set("stall")
      const [known, unknownKey] = await Promise.all([
        Promise.all(Array.from({ length: 4 }, () => chat({}))),
        chat({}, fresh),
      ])
      expect(known.map((o) => o.status)).toEqual([200, 200, 200, 200])
      expect({ status: unknownKey.status, code: unknownKey.code }).toEqual({
        status: 503,
        code: "admission_unavailable",
      })
      expect(unknownKey.millis).toBeLessThan(4_000)
      refused.add(unknownKey.requestId)
      pg.set("pass")
      await eventually(async () => (await chat({}, fresh)).status === 200, 10_000)
      await expectReleased()
    }, 75_000)
  })

  describe("afterwards", () => {
    it("the ledger is consistent: one usage record per request that ran, none for refused ones", async () => {
      await expectReleased()
      const due = [...ran.keys()].filter((id) => !mayLapse.has(id))
      let records: Array<UsageView> = []
      let absent: Array<string> = []
      const waitStarted = Date.now()
      // Charges claimed by a ledger writer whose claim reply was lost are written again after the
      // claim timeout (30 s, README: Scaling out): late is allowed, missing is not.
      await eventually(async () => {
        records = await usageOf(server, accountId)
        const have = new Set(records.map((r) => r.request_id))
        absent = due.filter((id) => !have.has(id))
        return absent.length === 0
      }, 40_000).catch(() => {
        const where = absent.map((id) => `${id} (${ran.get(id)})`)
        throw new Error(`no usage record for ${absent.length} of ${due.length} requests that ran: ${where}`)
      })
      if (Date.now() - waitStarted > 10_000)
        console.warn(`charges reached the ledger only after ${Date.now() - waitStarted} ms (a claim ran out)`)
      const ids = records.map((r) => r.request_id)
      expect(new Set(ids).size).toBe(ids.length)
      for (const id of refused) expect(ids).not.toContain(id)
      expect(ids.filter((id) => !ran.has(id))).toEqual([])
      expect(records.some((r) => r.outcome === "upstream_error")).toBe(true)
      await expectLedgerConsistent(database.url)
      expect(server.output()).not.toMatch(/internal error/)
    }, 60_000)
  })
})
