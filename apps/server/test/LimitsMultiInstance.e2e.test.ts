/**
 * Two gateway processes sharing one Redis and one database: the per-minute
 * limit, the daily quota, the concurrency limit and its queue hold for the
 * pair, not per process; and a killed process's slot comes back within a lease.
 */
import { describe, expect, it } from "@effect/vitest"
import OpenAI from "openai"
import { pairSkipped, usePair } from "./support/InstancePair"
import { createKey, type RunningServer } from "./support/ServerProcess"

if (pairSkipped) {
  console.warn(
    "[skip] limits across instances: TEST_REDIS_URL is not set, so the two-instance tests do not run",
  )
}

const MESSAGES = [{ role: "user" as const, content: "Name a river." }]
const LONG = [{ role: "user" as const, content: "Write a long, detailed essay about every river of Europe." }]
const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

/** A stream that runs on (2,000 tokens of the simulator) until aborted. */
const longStream = (client: OpenAI) =>
  client.chat.completions.create({ model: "swarm-prime", messages: LONG, max_tokens: 2000, stream: true })

describe.skipIf(pairSkipped)("limits across two instances", () => {
  let a: RunningServer
  let b: RunningServer
  usePair("multi", { SWARMGATE_LEASE_MS: "1500" }, (first, second) => {
    a = first
    b = second
  })

  const clients = (key: string) =>
    [a, b].map((server) => new OpenAI({ apiKey: key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 }))

  const ask = async (client: OpenAI, model = "swarm-prime") => {
    try {
      await client.chat.completions.create({ model, messages: MESSAGES, max_tokens: 1 })
      return "ok"
    } catch (error) {
      if (error instanceof OpenAI.APIError) return String(error.code)
      throw error
    }
  }

  const usageNow = async (server: RunningServer, accountId: string) =>
    (
      await server.admin<{ usage_now: { concurrency: number; queued: number } }>(
        "GET",
        `/accounts/${accountId}`,
      )
    ).body.usage_now

  it("the per-minute limit holds for the pair", async () => {
    const { key } = await createKey(a, { limits: { rpm: 4 } })
    const [viaA, viaB] = clients(key) as [OpenAI, OpenAI]
    const answers = await Promise.all([viaA, viaB, viaA, viaB, viaA, viaB, viaA, viaB].map((c) => ask(c)))
    expect(answers.filter((x) => x === "ok")).toHaveLength(4)
    expect(answers.filter((x) => x === "rate_limit_exceeded")).toHaveLength(4)
  }, 30_000)

  it("the daily quota holds for the pair", async () => {
    const { key, accountId } = await createKey(a, { limits: { daily: 3 } })
    const [viaA, viaB] = clients(key) as [OpenAI, OpenAI]
    expect(await ask(viaA)).toBe("ok")
    expect(await ask(viaB, "swarm-swift")).toBe("ok")
    expect(await ask(viaA)).toBe("ok")
    expect(await ask(viaB)).toBe("rate_limit_exceeded")
    expect(await ask(viaA, "swarm-swift")).toBe("rate_limit_exceeded")
    const seenFromB = await b.admin<{ usage_now: { daily_remaining: number } }>(
      "GET",
      `/accounts/${accountId}`,
    )
    expect(seenFromB.body.usage_now.daily_remaining).toBe(0)
  }, 30_000)

  it("the concurrency limit and its queue hold for the pair", async () => {
    const { key, accountId } = await createKey(a, { limits: { concurrency: 1, queue: 1 } })
    const [viaA, viaB] = clients(key) as [OpenAI, OpenAI]
    const stream = await longStream(viaA)
    await stream[Symbol.asyncIterator]().next()
    // B's request waits in the account's queue for A's slot; a third finds the queue full.
    const queued = ask(viaB)
    let waiting = false
    for (let i = 0; i < 100 && !waiting; i++) {
      waiting = (await usageNow(b, accountId)).queued === 1
      if (!waiting) await sleep(10)
    }
    expect(waiting).toBe(true)
    expect(await ask(viaB)).toBe("concurrency_limit_exceeded")
    expect(await ask(viaA)).toBe("concurrency_limit_exceeded")
    stream.controller.abort()
    expect(await queued).toBe("ok")
    // A slot is released when the request's scope closes, a Redis round trip after its answer went out.
    let usage = await usageNow(a, accountId)
    for (let i = 0; i < 100 && usage.concurrency !== 0; i++) {
      await sleep(20)
      usage = await usageNow(a, accountId)
    }
    expect(usage).toMatchObject({ concurrency: 0, queued: 0 })
  }, 30_000)

  /** The account's money and limits, once every request's release and settlement have landed. */
  const settledView = async (server: RunningServer, accountId: string) => {
    type View = {
      balance_usd: number
      held_usd: number
      usage_now: {
        concurrency: number
        queued: number
        rpm_remaining: Record<string, number>
        daily_remaining: number
      }
    }
    let view = (await server.admin<View>("GET", `/accounts/${accountId}`)).body
    for (let i = 0; i < 100 && (view.held_usd !== 0 || view.usage_now.concurrency !== 0); i++) {
      await sleep(20)
      view = (await server.admin<View>("GET", `/accounts/${accountId}`)).body
    }
    return view
  }

  // Scaled out, a request's admission and hold go to Redis in one write, and so do its release and
  // settlement: whichever of the two refuses, the other is undone.
  it("refused requests leave no trace in the shared stores: no money held, no rate token or quota unit used", async () => {
    const limited = await createKey(a, { balance_usd: 5, limits: { rpm: 2, daily: 10, concurrency: 4 } })
    const [viaA, viaB] = clients(limited.key) as [OpenAI, OpenAI]
    expect([await ask(viaA), await ask(viaB)]).toEqual(["ok", "ok"])
    const afterTwo = await settledView(b, limited.accountId)
    expect(afterTwo.balance_usd).toBeLessThan(5)
    for (const client of [viaA, viaB, viaA, viaB]) expect(await ask(client)).toBe("rate_limit_exceeded")
    const afterRefusals = await settledView(a, limited.accountId)
    expect(afterRefusals).toMatchObject({ balance_usd: afterTwo.balance_usd, held_usd: 0 })
    expect(afterRefusals.usage_now).toMatchObject({ concurrency: 0, queued: 0, daily_remaining: 8 })

    const broke = await createKey(b, {
      balance_usd: 0,
      limits: { rpm: 2, daily: 2, concurrency: 1, queue: 0 },
    })
    const [brokeA, brokeB] = clients(broke.key) as [OpenAI, OpenAI]
    for (const client of [brokeA, brokeB, brokeA, brokeB, brokeA])
      expect(await ask(client)).toBe("insufficient_quota")
    const unused = await settledView(a, broke.accountId)
    expect(unused).toMatchObject({ balance_usd: 0, held_usd: 0 })
    expect(unused.usage_now).toMatchObject({
      concurrency: 0,
      queued: 0,
      daily_remaining: 2,
      rpm_remaining: { "swarm-prime": 2 },
    })
  }, 30_000)

  it("a 429 keeps its x-ratelimit headers", async () => {
    const { key } = await createKey(a, { limits: { rpm: 2 } })
    const [viaA, viaB] = clients(key) as [OpenAI, OpenAI]
    expect([await ask(viaA), await ask(viaB)]).toEqual(["ok", "ok"])
    const refused = await viaA.chat.completions
      .create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
      .then(
        () => undefined,
        (error: unknown) => error,
      )
    expect(refused).toBeInstanceOf(OpenAI.APIError)
    const error = refused as InstanceType<typeof OpenAI.APIError>
    expect(error.status).toBe(429)
    expect(error.headers?.get("x-ratelimit-limit-requests")).toBe("2")
    expect(error.headers?.get("x-ratelimit-remaining-requests")).toBe("0")
  }, 30_000)

  it("a killed instance's slot comes back within one lease", async () => {
    const { key, accountId } = await createKey(a, { limits: { concurrency: 1, queue: 0 } })
    const [viaA, viaB] = clients(key) as [OpenAI, OpenAI]
    const stream = await longStream(viaA)
    await stream[Symbol.asyncIterator]().next()
    expect(await ask(viaB)).toBe("concurrency_limit_exceeded")
    a.process.kill("SIGKILL")
    const killedAt = Date.now()
    stream.controller.abort()
    while ((await usageNow(b, accountId)).concurrency !== 0) {
      expect(Date.now() - killedAt).toBeLessThan(3_000)
      await sleep(50)
    }
    expect(await ask(viaB)).toBe("ok")
  }, 30_000)
})

// A stream slow enough to keep a request queued behind it past a lease and a hold sweep.
describe.skipIf(pairSkipped)("a request queued behind a slow stream, across two instances", () => {
  let a: RunningServer
  let b: RunningServer
  usePair("multi-slow", { SWARMGATE_LEASE_MS: "1500", SWARMGATE_SIM_SPEED: "0.05" }, (first, second) => {
    a = first
    b = second
  })

  // Its hold was sent with its admission; it must stay held (renewed) while the request queues.
  it("a request queued longer than a lease and a sweep is held and charged for what ran", async () => {
    const { key, accountId } = await createKey(a, { balance_usd: 5, limits: { concurrency: 1, queue: 1 } })
    const [viaA, viaB] = [a, b].map(
      (server) => new OpenAI({ apiKey: key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 }),
    ) as [OpenAI, OpenAI]
    const stream = await longStream(viaA)
    await stream[Symbol.asyncIterator]().next()
    const queued = viaB.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
    // Past the lease (1.5 s) and the hold sweeper's period (5 s).
    await sleep(7_000)
    const now = await b.admin<{ usage_now: { concurrency: number; queued: number } }>(
      "GET",
      `/accounts/${accountId}`,
    )
    expect(now.body.usage_now).toMatchObject({ concurrency: 1, queued: 1 })
    stream.controller.abort()
    const answer = await queued
    expect(answer.object).toBe("chat.completion")
    let usage: Array<{ request_id: string }> = []
    for (let i = 0; i < 100 && usage.length < 2; i++) {
      await sleep(50)
      usage = (
        await b.admin<{ data: Array<{ request_id: string }> }>("GET", `/usage?account_id=${accountId}`)
      ).body.data
    }
    expect(usage.map((u) => u.request_id)).toContain(answer.id.replace(/^chatcmpl-/, "req_"))
    expect(usage).toHaveLength(2)
  }, 60_000)
})
