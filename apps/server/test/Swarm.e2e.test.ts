/**
 * The gateway in front of separate `apps/node-sim` processes over HTTP, as an
 * operator runs it: nodes registered through the admin API, failures injected
 * by node-sim flags, everything observed as a client and through
 * `GET /admin/v1/nodes`.
 */
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { countTokens } from "gpt-tokenizer"
import { eventually, usageOf } from "./support/Billing"
import {
  chat,
  drainNodes,
  type NodeSimProcess,
  nodesOf,
  pool,
  registerNodes,
  startNodeSim,
  until,
} from "./support/NodeSimProcess"
import { ADMIN_TOKEN, createKey, type RunningServer, startServer } from "./support/ServerProcess"

let server: RunningServer
let key: string
let accountId: string
const started: Array<NodeSimProcess> = []

const nodeSim = async (args: ReadonlyArray<string>, env: Record<string, string> = {}) => {
  const process = await startNodeSim(args, env)
  started.push(process)
  return process
}

const noLimits = Object.fromEntries(
  ["CONCURRENCY", "QUEUE", "RPM", "RPH", "DAILY", "WEEKLY"].map((name) => [
    `SWARMGATE_DEFAULT_${name}`,
    "none",
  ]),
)

beforeAll(async () => {
  const dir = mkdtempSync(join(tmpdir(), "swarm-e2e-"))
  const nodesFile = join(dir, "nodes.json")
  // An empty nodes file: no embedded simulated swarm, every node comes by registration.
  writeFileSync(nodesFile, "[]")
  server = await startServer({
    ...noLimits,
    SWARMGATE_NODES_FILE: nodesFile,
    SWARMGATE_PRESETS: JSON.stringify({
      "swarm-swift": {
        strategy: "consensus",
        consensus: { k: 3, quorum: 2, judges: 3, deadline_ms: 10_000 },
      },
    }),
    SWARMGATE_PROBE_INTERVAL_MS: "250",
    SWARMGATE_CIRCUIT_OPEN_MS: "1000",
    SWARMGATE_HEDGE_MS: "300",
    SWARMGATE_DISPATCH_QUEUE_MS: "400",
    SWARMGATE_IDLE_TIMEOUT_MS: "5000",
    SWARMGATE_KEEPALIVE_MS: "25",
  })
  const issued = await createKey(server, { balance_usd: 1_000 })
  key = issued.key
  accountId = issued.accountId
}, 60_000)

afterAll(async () => {
  await Promise.all(started.map((p) => p.stop()))
  await server?.stop()
})

const ask = (i: number) => [
  { role: "user", content: `Question ${i % 40}: how do rivers shape valleys over time?` },
]

/** Everything a client could count as an error: a status, a final error event, a stream without [DONE]. */
const problem = (result: Awaited<ReturnType<typeof chat>>, streamed: boolean) => {
  if (result.status !== 200) return `status ${result.status}`
  if (streamed && (!result.done || result.events.some((e) => "error" in e))) return "stream broke"
  if (result.text.length === 0) return "empty answer"
  return undefined
}

describe("the swarm over HTTP", () => {
  it("membership starts empty: the nodes file is empty and no simulated nodes were asked for", async () => {
    expect(await nodesOf(server)).toEqual([])
  })

  it("with 20% of nodes failing before the first token, 1,000 requests complete with zero client-visible errors", async () => {
    const healthy = await nodeSim(["--nodes", "8", "--seed", "1", "--speed", "50", "--capacity", "12"])
    const failing = await nodeSim([
      "--nodes",
      "2",
      "--seed",
      "2",
      "--speed",
      "50",
      "--capacity",
      "12",
      "--fail-before-first-token",
      "1",
    ])
    const all = [...healthy.nodes, ...failing.nodes]
    await registerNodes(server, all, ["swarm-prime"], { ttl_ms: 600_000 })
    try {
      const results = await pool(1_000, 24, async (i) => {
        const streamed = i % 2 === 0
        const result = await chat(server.baseUrl, key, {
          model: "swarm-prime",
          stream: streamed,
          max_tokens: 12,
          messages: ask(i),
        })
        return problem(result, streamed)
      })
      expect(results.filter((p) => p !== undefined)).toEqual([])

      // The failing nodes were tried and broken off; the healthy ones carried the load.
      const views = await nodesOf(server)
      for (const node of failing.nodes) {
        const view = views.find((v) => v.id === node.id)!
        expect(view.failures).toBeGreaterThanOrEqual(3)
        expect(view.last_failure).toMatch(/failed_before_first_token/)
      }
      const failingHits = (await failing.stats()).reduce((sum, s) => sum + s.requests, 0)
      expect(failingHits).toBeGreaterThanOrEqual(6)
      const served = views.filter((v) => healthy.nodes.some((n) => n.id === v.id))
      expect(served.reduce((sum, v) => sum + v.requests, 0)).toBeGreaterThanOrEqual(1_000)
      for (const view of served) {
        expect(view.circuit).toBe("closed")
        expect(view.ttft_ms).not.toBeNull()
        expect(view.tokens_per_second).not.toBeNull()
        expect(view.in_flight).toBe(0)
      }
    } finally {
      await drainNodes(server, all)
    }
  }, 60_000)

  it("a node breaking mid-stream: exactly one final upstream_error event, charged only for what ran", async () => {
    const breaking = await nodeSim([
      "--nodes",
      "1",
      "--seed",
      "3",
      "--speed",
      "20",
      "--capacity",
      "8",
      "--break-mid-stream",
      "1",
    ])
    await registerNodes(server, breaking.nodes, ["swarm-prime"], { ttl_ms: 600_000 })
    try {
      const streamed = await chat(server.baseUrl, key, {
        model: "swarm-prime",
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 300,
        messages: ask(1),
      })
      expect(streamed.status).toBe(200)
      expect(streamed.done).toBe(false)
      const errors = streamed.events.filter((e) => "error" in e)
      expect(errors).toHaveLength(1)
      expect(streamed.events.at(-1)).toBe(errors[0])
      const requestId = streamed.headers.get("x-request-id")
      expect(errors[0]).toEqual({
        error: { message: expect.any(String), type: "server_error", code: "upstream_error" },
        request_id: requestId,
      })
      expect(streamed.text.length).toBeGreaterThan(0)

      const plain = await chat(server.baseUrl, key, {
        model: "swarm-prime",
        max_tokens: 300,
        messages: ask(2),
      })
      expect(plain.status).toBe(502)
      expect((plain.body as { error: { code: string } }).error.code).toBe("upstream_error")
      expect(plain.headers.get("retry-after")).toBeNull()

      // The usage record holds the tokens the client received, not the cap.
      let record: Awaited<ReturnType<typeof usageOf>>[number] | undefined
      await eventually(async () => {
        record = (await usageOf(server, accountId)).find((u) => u.request_id === requestId)
        return record !== undefined
      })
      expect(record!.outcome).toBe("upstream_error")
      expect(record!.completion_tokens).toBe(countTokens(streamed.text))
      expect(record!.completion_tokens).toBeLessThan(300)
      expect(record!.cost_usd).toBeGreaterThan(0)
      let plainRecord: typeof record
      await eventually(async () => {
        plainRecord = (await usageOf(server, accountId)).find(
          (u) => u.request_id === plain.headers.get("x-request-id"),
        )
        return plainRecord !== undefined
      })
      expect(plainRecord!.outcome).toBe("upstream_error")
    } finally {
      await drainNodes(server, breaking.nodes)
    }
  }, 30_000)

  it("a stalled node triggers a hedge: the client gets its answer from another node, the stalled request is cancelled", async () => {
    const stalled = await nodeSim([
      "--nodes",
      "1",
      "--seed",
      "4",
      "--speed",
      "20",
      "--capacity",
      "64",
      "--stall-before-first-token",
      "1",
    ])
    const backup = await nodeSim(["--nodes", "1", "--seed", "5", "--speed", "20", "--capacity", "2"])
    await registerNodes(server, [...stalled.nodes, ...backup.nodes], ["swarm-prime"], { ttl_ms: 600_000 })
    try {
      for (let i = 0; i < 3; i++) {
        const began = Date.now()
        const result = await chat(server.baseUrl, key, {
          model: "swarm-prime",
          stream: true,
          max_tokens: 20,
          messages: ask(i),
        })
        expect(problem(result, true)).toBeUndefined()
        // The stalled node would never answer; the hedge starts after 300 ms.
        expect(Date.now() - began).toBeLessThan(5_000)
      }
      const views = await nodesOf(server)
      const stalledView = views.find((v) => v.id === stalled.nodes[0]!.id)!
      expect(stalledView.hedges).toBe(3)
      expect(stalledView.ttft_ms).toBeGreaterThanOrEqual(250)
      expect(views.find((v) => v.id === backup.nodes[0]!.id)!.requests).toBe(3)
      expect(stalledView.in_flight).toBe(0)
      // The losing requests were cut at the node, not left running (health probes may stall there too).
      expect(await until(async () => (await stalled.stats())[0]!.aborted >= 3, 2_000)).toBe(true)
    } finally {
      await drainNodes(server, [...stalled.nodes, ...backup.nodes])
    }
  }, 30_000)

  it("a killed node process is circuit-broken within seconds and traffic moves to the others", async () => {
    const survivor = await nodeSim(["--nodes", "2", "--seed", "6", "--speed", "50", "--capacity", "8"])
    const doomed = await nodeSim(["--nodes", "2", "--seed", "7", "--speed", "50", "--capacity", "8"])
    const all = [...survivor.nodes, ...doomed.nodes]
    await registerNodes(server, all, ["swarm-prime"], { ttl_ms: 600_000 })
    let running = true
    const log: Array<{ at: number; problem: string | undefined }> = []
    const load = pool(4, 4, async () => {
      while (running) {
        const result = await chat(server.baseUrl, key, {
          model: "swarm-prime",
          max_tokens: 8,
          messages: ask(log.length),
        })
        log.push({ at: Date.now(), problem: problem(result, false) })
      }
    })
    try {
      await new Promise((r) => setTimeout(r, 800))
      const before = (await nodesOf(server)).filter((v) => doomed.nodes.some((n) => n.id === v.id))
      expect(before.reduce((sum, v) => sum + v.requests, 0)).toBeGreaterThan(0)
      await doomed.kill()
      const killedAt = Date.now()
      const broken = await until(async () => {
        const views = await nodesOf(server)
        return doomed.nodes.every((n) => views.find((v) => v.id === n.id)?.circuit !== "closed")
      }, 5_000)
      const openedAt = Date.now()
      expect(broken).toBe(true)
      expect(openedAt - killedAt).toBeLessThan(3_000)
      const servedBefore = (await survivor.stats()).reduce((sum, s) => sum + s.requests, 0)
      const clientBefore = log.length
      await new Promise((r) => setTimeout(r, 1_000))
      running = false
      await load
      const servedAfter = (await survivor.stats()).reduce((sum, s) => sum + s.requests, 0)
      // Every request after the circuits opened went to the surviving process, and succeeded.
      expect(servedAfter - servedBefore).toBeGreaterThanOrEqual(log.length - clientBefore - 4)
      expect(log.filter((entry) => entry.at > openedAt && entry.problem !== undefined)).toEqual([])
      // Only requests caught mid-answer by the kill could fail (502 upstream_error), at most one per client.
      expect(log.filter((entry) => entry.problem !== undefined).length).toBeLessThanOrEqual(4)
      const views = await nodesOf(server)
      for (const node of doomed.nodes)
        expect(views.find((v) => v.id === node.id)!.last_failure).toMatch(/unreachable|broken|probe/)
    } finally {
      running = false
      await load
      await drainNodes(server, all)
    }
  }, 30_000)

  it("all nodes busy: the request waits in the dispatch queue, then 429 capacity_exhausted with Retry-After", async () => {
    const small = await nodeSim([
      "--nodes",
      "1",
      "--seed",
      "8",
      "--speed",
      "1",
      "--capacity",
      "2",
      "--tokens-per-second",
      "20",
    ])
    await registerNodes(server, small.nodes, ["swarm-prime"], { ttl_ms: 600_000 })
    const controllers = [new AbortController(), new AbortController()]
    try {
      // Two long answers fill the node.
      for (const controller of controllers) {
        const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify({ model: "swarm-prime", stream: true, max_tokens: 400, messages: ask(3) }),
          signal: controller.signal,
        })
        expect(response.status).toBe(200)
        await response.body!.getReader().read()
      }
      const began = Date.now()
      const refused = await chat(server.baseUrl, key, {
        model: "swarm-prime",
        max_tokens: 10,
        messages: ask(4),
      })
      expect(Date.now() - began).toBeGreaterThanOrEqual(350)
      expect(refused.status).toBe(429)
      expect(refused.body).toMatchObject({ error: { code: "capacity_exhausted", type: "server_error" } })
      const retryAfter = Number(refused.headers.get("retry-after"))
      expect(Number.isInteger(retryAfter)).toBe(true)
      expect(retryAfter).toBeGreaterThanOrEqual(1)
      expect(retryAfter).toBeLessThanOrEqual(60)

      // A slot freed while a request waits goes to it.
      const waiting = chat(server.baseUrl, key, { model: "swarm-prime", max_tokens: 5, messages: ask(5) })
      await new Promise((r) => setTimeout(r, 100))
      controllers[0]!.abort()
      expect((await waiting).status).toBe(200)
    } finally {
      for (const controller of controllers) controller.abort()
      await drainNodes(server, small.nodes)
    }
  }, 30_000)

  it("consensus (swarm-swift here): judges rank the answers while the stream keeps alive, the winner streams, its tokens are charged", async () => {
    const swarm = await nodeSim([
      "--nodes",
      "8",
      "--seed",
      "9",
      "--speed",
      "4",
      "--capacity",
      "8",
      "--dishonest",
      "0.25",
    ])
    await registerNodes(server, swarm.nodes, ["swarm-swift"], { ttl_ms: 600_000 })
    try {
      const result = await chat(server.baseUrl, key, {
        model: "swarm-swift",
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: 120,
        messages: [{ role: "user", content: "How do glaciers carve valleys in mountain ranges?" }],
      })
      expect(problem(result, true)).toBeUndefined()
      // Keep-alive comments between the role chunk and the first token: the ranking.
      expect(result.comments.filter((c) => c.before === 1).length).toBeGreaterThan(0)
      const usage = result.events.at(-1)!.usage as { completion_tokens: number }
      expect(usage.completion_tokens).toBe(countTokens(result.text))
      let record: Awaited<ReturnType<typeof usageOf>>[number] | undefined
      await eventually(async () => {
        record = (await usageOf(server, accountId)).find(
          (u) => u.request_id === result.headers.get("x-request-id"),
        )
        return record !== undefined
      })
      expect([record!.model, record!.outcome, record!.completion_tokens]).toEqual([
        "swarm-swift",
        "completed",
        usage.completion_tokens,
      ])
      const views = (await nodesOf(server)).filter((v) => swarm.nodes.some((n) => n.id === v.id))
      // Three authors and three judges worked; judges' reputations moved; every slot is free.
      expect(views.filter((v) => v.requests > 0).length).toBeGreaterThanOrEqual(6)
      expect(views.some((v) => v.reputation !== 0.75)).toBe(true)
      for (const view of views) expect(view.in_flight).toBe(0)
    } finally {
      await drainNodes(server, swarm.nodes)
    }
  }, 30_000)

  it("node-sim --register keeps its nodes registered; SIGTERM drains them; a killed process's nodes expire", async () => {
    const token = { SWARMGATE_ADMIN_TOKEN: ADMIN_TOKEN }
    const args = ["--nodes", "2", "--speed", "50", "--register", server.baseUrl, "--register-ttl-ms", "1200"]
    const polite = await nodeSim([...args, "--seed", "10", "--presets", "swarm-prime"], token)
    const ids = (p: NodeSimProcess) => p.nodes.map((n) => n.id)
    const listed = async (p: NodeSimProcess) => {
      const views = await nodesOf(server)
      return ids(p).filter((id) => views.some((v) => v.id === id && v.state === "active"))
    }
    expect(await until(async () => (await listed(polite)).length === 2, 5_000)).toBe(true)
    const view = (await nodesOf(server)).find((v) => v.id === polite.nodes[0]!.id)!
    expect([view.source, view.models]).toEqual(["registered", { "swarm-prime": polite.nodes[0]!.id }])
    expect(view.expires_at).not.toBeNull()
    const answered = await chat(server.baseUrl, key, {
      model: "swarm-prime",
      max_tokens: 5,
      messages: ask(6),
    })
    expect(answered.status).toBe(200)
    // Heartbeats outlive the registration lifetime.
    await new Promise((r) => setTimeout(r, 1_600))
    expect(await listed(polite)).toHaveLength(2)
    await polite.stop()
    expect(await until(async () => (await listed(polite)).length === 0, 3_000)).toBe(true)

    const rude = await nodeSim([...args, "--seed", "11", "--presets", "swarm-prime"], token)
    expect(await until(async () => (await listed(rude)).length === 2, 5_000)).toBe(true)
    await rude.kill()
    expect(await until(async () => (await listed(rude)).length === 0, 4_000)).toBe(true)
  }, 30_000)
})
