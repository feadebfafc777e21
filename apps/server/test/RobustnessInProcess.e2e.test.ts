/**
 * The gateway assembled from the server's own layers, listening in this
 * process, for what a separate process cannot show:
 *
 * - how many key lookups reach the repository under a flood of bad keys (the
 *   repository is wrapped with a counter);
 * - that a client which stops reading an SSE stream stops the node: the
 *   client's connection is an in-memory stream whose reads the test pauses, so
 *   no kernel socket buffer (megabytes on loopback, more than a whole capped
 *   stream) hides whether the gateway waits for the client.
 */

import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Duplex } from "node:stream"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { AdminHttp } from "@swarmgate/admin"
import { ApiKeys, KeyFormat, Repository } from "@swarmgate/auth"
import { GatewayConfig, HttpServer } from "@swarmgate/gateway"
import { RedisStore } from "@swarmgate/quota"
import {
  ConfigProvider,
  Effect,
  Exit,
  Layer,
  Logger,
  LogLevel,
  ManagedRuntime,
  Scope,
  Supervisor,
} from "effect"
import { AdminConfigLive, BillingLive, LimitsLive, OpsLive, StoreLive, SwarmLive } from "../src/Layers"
import { redisUrl } from "./support/InstancePair"
import { rawExchange } from "./support/RawHttp"

const ADMIN = "in-process-admin-token"
const PAD = "x".repeat(4_096)

/** An OpenAI-compatible node that streams one-token deltas, each padded to 4 KiB, honouring backpressure. */
interface FakeNode {
  readonly url: string
  /** Bytes written to the gateway so far, for the current stream. */
  bytes: number
  events: number
  /** Waiting for `drain`: the gateway is not reading. */
  blocked: boolean
  finished: boolean
  aborted: boolean
  readonly server: Server
}

const startFakeNode = async (): Promise<FakeNode> => {
  const node = { bytes: 0, events: 0, blocked: false, finished: false, aborted: false } as FakeNode
  const server = createServer(async (req: IncomingMessage, res: ServerResponse) => {
    let raw = ""
    for await (const chunk of req) raw += chunk
    const body = JSON.parse(raw) as { max_tokens?: number }
    const cap = body.max_tokens ?? 16
    const probe = cap <= 1
    res.writeHead(200, { "content-type": "text/event-stream" })
    if (!probe) Object.assign(node, { bytes: 0, events: 0, blocked: false, finished: false, aborted: false })
    res.on("close", () => {
      if (!res.writableFinished && !probe) node.aborted = true
    })
    for (let i = 0; i < cap && !res.destroyed; i++) {
      const event = `data: {"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}],"pad":"${probe ? "" : PAD}"}\n\n`
      const ok = res.write(event)
      if (!probe) {
        node.bytes += event.length
        node.events++
      }
      if (!ok) {
        if (!probe) node.blocked = true
        await new Promise<void>((resolve) => {
          const done = () => {
            res.off("drain", done)
            res.off("close", done)
            resolve()
          }
          res.on("drain", done)
          res.on("close", done)
        })
        if (!probe) node.blocked = false
      }
    }
    if (!res.destroyed) {
      res.end(`data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\ndata: [DONE]\n\n`)
      if (!probe) node.finished = true
    }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return Object.assign(node, {
    server,
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
  })
}

/** A gateway assembled in this process from the server's layers, its key lookups counted. */
interface InProcess {
  readonly port: number
  readonly server: Server
  /** Key lookups by hash so far. */
  readonly lookups: () => number
  readonly resetLookups: () => void
  /** Fibers started on its runtime so far (requests, and the server's own background work). */
  readonly fibers: () => number
  readonly admin: <T = Record<string, unknown>>(method: string, path: string, body?: unknown) => Promise<T>
  readonly stop: () => Promise<void>
}

const startInProcess = async (
  nodesFile: string,
  database: string,
  extra: ReadonlyArray<readonly [string, string]> = [],
): Promise<InProcess> => {
  let lookups = 0
  let fibers = 0
  const counting = new (class extends Supervisor.AbstractSupervisor<void> {
    value = Effect.void
    override onStart() {
      fibers++
    }
  })()
  const config = ConfigProvider.fromMap(
    new Map([
      ["DATABASE_URL", database],
      ["SWARMGATE_ADMIN_TOKEN", ADMIN],
      ["SWARMGATE_NODES_FILE", nodesFile],
      ["SWARMGATE_HEDGE_MS", "0"],
      // One node streams to the client; consensus reads whole answers before the stream opens.
      ["SWARMGATE_PRESETS", JSON.stringify({ "swarm-prime": { strategy: "single" } })],
      ["SWARMGATE_PROBE_INTERVAL_MS", "60000"],
      ["SWARMGATE_DEFAULT_RPM", "none"],
      ["SWARMGATE_DEFAULT_RPH", "none"],
      ...extra,
    ]),
  )
  // The server's layers, with the key repository wrapped to count lookups by hash.
  const counted = Layer.effect(
    Repository.Repository,
    Effect.map(Repository.Repository, (repository) => ({
      ...repository,
      findByHash: (hash: string) =>
        Effect.suspend(() => {
          lookups++
          return repository.findByHash(hash)
        }),
    })),
  ).pipe(Layer.provide(StoreLive))
  const auth = ApiKeys.layer().pipe(Layer.provide(counted), Layer.provideMerge(StoreLive))
  const gateway = AdminHttp.layer.pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        auth,
        SwarmLive,
        GatewayConfig.layerFromEnv,
        BillingLive,
        LimitsLive,
        OpsLive,
        AdminConfigLive,
      ),
    ),
  )
  const runtime = ManagedRuntime.make(
    gateway.pipe(
      Layer.provide(Layer.setConfigProvider(config)),
      Layer.provide(Logger.minimumLogLevel(LogLevel.Error)),
      Layer.provide(Supervisor.addSupervisor(counting)),
    ),
  )
  const scope = Effect.runSync(Scope.make())
  const listening = await runtime.runPromise(
    Scope.extend(HttpServer.listen({ port: 0, host: "127.0.0.1", drainMillis: 100 }), scope),
  )
  const { port } = listening
  return {
    port,
    server: listening.server,
    lookups: () => lookups,
    fibers: () => fibers,
    resetLookups: () => {
      lookups = 0
    },
    admin: async <T = Record<string, unknown>>(method: string, path: string, body?: unknown) => {
      const response = await fetch(`http://127.0.0.1:${port}/admin/v1${path}`, {
        method,
        headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      })
      return (await response.json()) as T
    },
    stop: async () => {
      await Effect.runPromise(Scope.close(scope, Exit.void)).catch(() => {})
      await runtime.dispose()
    },
  }
}

let node: FakeNode
let dir: string
let nodesFile: string
let gateway: InProcess | undefined
let server: Server
let port: number
let admin: InProcess["admin"]

beforeAll(async () => {
  node = await startFakeNode()
  dir = mkdtempSync(join(tmpdir(), "swarmgate-inprocess-"))
  nodesFile = join(dir, "nodes.json")
  writeFileSync(
    nodesFile,
    JSON.stringify([{ id: "fake", url: node.url, models: { "swarm-prime": "fake" }, capacity: 4 }]),
  )
  gateway = await startInProcess(nodesFile, `sqlite:${join(dir, "gateway.db")}`)
  ;({ server, port, admin } = gateway)
}, 60_000)

afterAll(async () => {
  await gateway?.stop()
  node?.server.closeAllConnections()
  node?.server.close()
  rmSync(dir, { recursive: true, force: true })
})

const issueKey = async () => {
  const account = await admin<{ id: string }>("POST", "/accounts", { name: "in-process", balance_usd: 100 })
  return (await admin<{ key: string }>("POST", `/accounts/${account.id}/keys`, {})).key
}

describe("bad-key floods", () => {
  it("10,000 bad keys cost a lookup only per distinct well-formed key per cache second", async () => {
    const valid = await issueKey()
    const unknown = Array.from({ length: 20 }, () => KeyFormat.generateKey().key)
    const keyFor = (i: number): string => {
      switch (i % 4) {
        case 0:
          return unknown[i % unknown.length]!
        case 1: {
          const k = KeyFormat.generateKey().key
          return `${k.slice(0, -1)}${k.endsWith("0") ? "1" : "0"}`
        }
        case 2:
          return `sk-swarm-${i.toString(36).padStart(49, "z")}`
        default:
          return `${i}`
      }
    }
    const models = (key: string) =>
      `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n\r\n`
    gateway!.resetLookups()
    const started = Date.now()
    // Pipelined on 4 connections, 2,500 requests each.
    const statuses = await Promise.all(
      Array.from({ length: 4 }, async (_, c) => {
        const exchange = rawExchange(port, undefined, 30_000)
        let text = ""
        const all = new Promise<string>((resolve) => {
          exchange.socket.on("data", (chunk: Buffer) => {
            text += chunk.toString("latin1")
            if ((text.match(/HTTP\/1\.1 /g) ?? []).length >= 2_500) resolve(text)
          })
        })
        for (let batch = 0; batch < 50; batch++) {
          let data = ""
          for (let j = 0; j < 50; j++) data += models(keyFor(c * 2_500 + batch * 50 + j))
          exchange.socket.write(data)
          await new Promise((resolve) => setImmediate(resolve))
        }
        const received = await all
        exchange.socket.destroy()
        return [...received.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => m[1])
      }),
    )
    const seconds = Math.ceil((Date.now() - started) / 1_000)
    expect(statuses.flat().filter((s) => s !== "401")).toEqual([])
    expect(statuses.flat()).toHaveLength(10_000)
    // Only the well-formed keys (valid checksum) were looked up: each once per second of cache at most.
    expect(gateway!.lookups()).toBeGreaterThanOrEqual(unknown.length)
    expect(gateway!.lookups()).toBeLessThanOrEqual(unknown.length * (seconds + 1))
    console.info(`10,000 bad keys in ${seconds} s: ${gateway!.lookups()} repository lookups`)

    // A valid key: one lookup, then the cache.
    gateway!.resetLookups()
    for (let i = 0; i < 20; i++) {
      const response = await fetch(`http://127.0.0.1:${port}/v1/models`, {
        headers: { authorization: `Bearer ${valid}` },
      })
      expect(response.status).toBe(200)
      await response.text()
    }
    expect(gateway!.lookups()).toBeLessThanOrEqual(2)
  }, 30_000)
})

/**
 * A client connection as an in-memory duplex: what the gateway writes is
 * handed to `onData`, and while `paused` the write callbacks are held, exactly
 * like a socket whose peer stopped reading.
 */
const memoryConnection = (pauseWhen: (received: string) => boolean) => {
  let paused = false
  const held: Array<() => void> = []
  let received = ""
  let inFlight = 0
  const serverSide = new Duplex({
    writableHighWaterMark: 16 * 1024,
    read() {},
    write(chunk: Buffer, _encoding, callback) {
      inFlight += chunk.length
      const deliver = () => {
        inFlight -= chunk.length
        received += chunk.toString("utf8")
        // Stops reading at a chosen point, not whenever a poll happens to look.
        if (!paused && pauseWhen(received)) {
          paused = true
          pauseWhen = () => false
        }
        callback()
      }
      if (paused) held.push(deliver)
      else deliver()
    },
  })
  return {
    serverSide,
    send: (data: string) => serverSide.push(data),
    resume: () => {
      paused = false
      for (const deliver of held.splice(0)) deliver()
    },
    /** Bytes the gateway has handed over but the client has not taken, plus what it buffered itself. */
    backlog: () => inFlight + serverSide.writableLength,
    received: () => received,
  }
}

describe("SSE backpressure", () => {
  it("a client that stops reading stops the node; reading again finishes the stream", async () => {
    const key = await issueKey()
    // Stop reading once the first content chunk is in.
    const client = memoryConnection((received) => received.includes('"content":" a"'))
    server.emit("connection", client.serverSide)
    const body = JSON.stringify({
      model: "swarm-prime",
      stream: true,
      messages: [{ role: "user", content: "Hi" }],
    })
    client.send(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
    )
    const deadline = Date.now() + 5_000
    while (!client.received().includes('"content":" a"') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 10))
    expect(client.received()).toMatch(/^HTTP\/1\.1 200 /)
    // The node ends up waiting for the gateway, which waits for the client (or it runs to the end).
    const blockedBy = Date.now() + 10_000
    while (!node.blocked && !node.finished && Date.now() < blockedBy)
      await new Promise((r) => setTimeout(r, 20))
    expect(node.blocked).toBe(true)
    // Socket buffers between the node and the gateway settle, then nothing moves.
    await new Promise((r) => setTimeout(r, 500))
    const early = { bytes: node.bytes, events: node.events }
    await new Promise((r) => setTimeout(r, 500))
    expect(node.blocked).toBe(true)
    expect(node.bytes).toBe(early.bytes)
    expect(node.events).toBeLessThan(4_096)
    expect(node.finished).toBe(false)
    // The gateway holds no more than one socket buffer's worth for the client.
    expect(client.backlog()).toBeLessThan(64 * 1024)
    console.info(
      `paused reader: node stopped after ${node.events} of 4,096 events (${(node.bytes / 2 ** 20).toFixed(1)} MiB), gateway backlog ${client.backlog()} bytes`,
    )

    client.resume()
    const until = Date.now() + 20_000
    while (!client.received().includes("data: [DONE]") && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 20))
    }
    const text = client.received()
    expect(text).toContain('"finish_reason":"length"')
    expect(text.endsWith("data: [DONE]\n\n") || text.includes("data: [DONE]\n\n")).toBe(true)
    const content = [...text.matchAll(/"delta":\{"content":"((?:[^"\\]|\\.)*)"\}/g)].map((m) => m[1]).join("")
    expect(content).toBe(" a".repeat(4_096))
    client.serverSide.destroy()
  }, 40_000)
})

/**
 * A client gone mid-stream on the plain path: the node stopped, its slot and
 * hold released, what was sent charged.
 */
const abortOnPlainPath = async ({ admin, port, lookups }: InProcess) => {
  const account = await admin<{ id: string }>("POST", "/accounts", { name: "plain", balance_usd: 100 })
  const key = (await admin<{ key: string }>("POST", `/accounts/${account.id}/keys`, {})).key
  const ask = (stream: boolean, maxTokens: number, signal?: AbortSignal) =>
    fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "swarm-prime",
        stream,
        max_tokens: maxTokens,
        messages: [{ role: "user", content: "Hi" }],
      }),
      ...(signal === undefined ? {} : { signal }),
    })
  const money = async () => {
    const found = await admin<{ balance_usd: number; held_usd: number }>("GET", `/accounts/${account.id}`)
    return { balance: found.balance_usd, held: found.held_usd }
  }
  // The first request looks the key up; the next, right after it, finds it cached and starts on
  // the plain path (no lookup) — unless the machine was so slow that the cache second passed.
  const warmedAt = Date.now()
  const warm = await ask(false, 4)
  expect(warm.status).toBe(200)
  await warm.json()
  const lookedUp = lookups()
  const before = await money()
  expect(before.held).toBe(0)

  const controller = new AbortController()
  const response = await ask(true, 4_000, controller.signal)
  // The key's lookup, at the first request's start, is trusted for a second.
  const cached = Date.now() - warmedAt < 900
  expect(response.status).toBe(200)
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let text = ""
  while (!text.includes('"content":" a"')) text += decoder.decode((await reader.read()).value)
  if (cached) expect(lookups()).toBe(lookedUp)
  controller.abort()

  const until = Date.now() + 10_000
  const settled = async () => {
    const nodes = await admin<{ data: ReadonlyArray<{ id: string; in_flight: number }> }>("GET", "/nodes")
    const now = await money()
    return node.aborted && nodes.data.every((n) => n.in_flight === 0) && now.held === 0 ? now : undefined
  }
  let after = await settled()
  while (after === undefined && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 50))
    after = await settled()
  }
  expect(after).toBeDefined()
  expect(node.finished).toBe(false)
  // Generation started: charged (for what went out), the hold resolved.
  expect(after!.balance).toBeLessThan(before.balance)
}

/** 40 JSON completions with a cached key on `gateway`: far fewer fibers than requests (one each on a fiber). */
const plainJsonStartsNoFiber = async (gateway: InProcess) => {
  const account = await gateway.admin<{ id: string }>("POST", "/accounts", {
    name: "plain",
    balance_usd: 100,
  })
  const { key } = await gateway.admin<{ key: string }>("POST", `/accounts/${account.id}/keys`, {})
  const ask = async () => {
    const response = await fetch(`http://127.0.0.1:${gateway.port}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "swarm-prime",
        max_tokens: 2,
        messages: [{ role: "user", content: "Hi" }],
      }),
    })
    expect(response.status).toBe(200)
    await response.json()
  }
  await ask()
  const before = gateway.fibers()
  // The supervisor counts: the first request looked its key up on a fiber.
  expect(before).toBeGreaterThan(0)
  const requests = 40
  for (let i = 0; i < requests; i++) await ask()
  // A request whose key the cache let go (once a second) runs on a fiber, as does background work;
  // the common request, on none (one each before the plain path).
  expect(gateway.fibers() - before).toBeLessThan(requests / 2)
}

/**
 * The common chat completion runs on no fiber (HttpServer's `PlainRun`) once
 * its key is cached: the client going away must still reach everything it
 * acquired, through the plain run's own interruption.
 */
describe("the common chat completion, run by plain calls", () => {
  it("a JSON completion with its key cached starts no fiber", () => plainJsonStartsNoFiber(gateway!), 30_000)

  it(
    "a client gone mid-stream: the node stopped, its slot and hold released, what was sent charged",
    () => abortOnPlainPath(gateway!),
    30_000,
  )

  // Scaled out (Redis limits and book), the request's admission and hold are Redis replies read by
  // plain calls, and their release and settlement run when its scope closes.
  it.skipIf(redisUrl === undefined && process.env.SWARMGATE_REQUIRE_SERVICES !== "1")(
    "scaled out: the same, the permit and hold in Redis",
    async () => {
      if (redisUrl === undefined) throw new Error("TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)")
      const prefix = `test:plain:${randomBytes(6).toString("hex")}:`
      const scaled = await startInProcess(nodesFile, `sqlite:${join(dir, "scaled.db")}`, [
        ["REDIS_URL", redisUrl],
        ["SWARMGATE_REDIS_PREFIX", prefix],
      ])
      try {
        // Admission, hold, release and settlement are Redis replies read by callback: no fiber either.
        await plainJsonStartsNoFiber(scaled)
        await abortOnPlainPath(scaled)
      } finally {
        await scaled.stop()
        await Effect.runPromise(RedisStore.reset({ url: redisUrl, prefix }))
      }
    },
    60_000,
  )
})
