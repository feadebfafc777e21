/**
 * Limits through the real server with the official `openai` client: rate
 * limits with an honest Retry-After, the concurrency limit and its slot freed
 * the moment a stream is aborted, requests refused after admission (billing,
 * capacity) leaving no trace, the instance bound, and the Redis failure policy.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import OpenAI from "openai"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

const MESSAGES = [{ role: "user" as const, content: "Name a river." }]
const LONG = [{ role: "user" as const, content: "Write a long, detailed essay about every river of Europe." }]

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))

let server: RunningServer

beforeAll(async () => {
  // Slow enough that a stream is still running while we look at it.
  server = await startServer({ SWARMGATE_SIM_SPEED: "1", SWARMGATE_MAX_IN_FLIGHT: "2" })
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const clientFor = (key: string, target: RunningServer = server) =>
  new OpenAI({ apiKey: key, baseURL: `${target.baseUrl}/v1`, maxRetries: 0 })

/** The 429/503 the client raised, with what a caller would branch on. */
const refusal = async (promise: Promise<unknown>) => {
  try {
    await promise
  } catch (error) {
    if (!(error instanceof OpenAI.APIError)) throw error
    const retryAfter = error.headers?.get("retry-after") ?? null
    return {
      status: error.status,
      code: error.code,
      retryAfter: retryAfter === null ? null : Number(retryAfter),
      headers: error.headers,
    }
  }
  throw new Error("expected a refusal")
}

const usageNow = async (accountId: string, target: RunningServer = server) => {
  const account = await target.admin<{ usage_now: Record<string, unknown> }>("GET", `/accounts/${accountId}`)
  expect(account.status).toBe(200)
  return account.body.usage_now as {
    concurrency: number
    queued: number
    rpm_remaining: Record<string, number> | null
    rph_remaining: Record<string, number> | null
    daily_remaining: number | null
    weekly_remaining: number | null
  }
}

describe("rate limits", () => {
  it("the n+1-th request in a minute gets 429 rate_limit_exceeded with a Retry-After that holds", async () => {
    const rpm = 6
    const { key, accountId } = await createKey(server, { limits: { rpm } })
    const client = clientFor(key)
    for (let i = 0; i < rpm; i++) {
      const { response } = await client.chat.completions
        .create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
        .withResponse()
      expect(response.headers.get("x-ratelimit-limit-requests")).toBe(String(rpm))
      expect(response.headers.get("x-ratelimit-remaining-requests")).toBe(String(rpm - 1 - i))
      expect(response.headers.get("x-ratelimit-reset-requests")).toMatch(/^(\d+ms|[\d.]+s|\d+m[\d.]+s)$/)
    }
    const refused = await refusal(
      client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
    )
    const refusedAt = Date.now()
    expect(refused).toMatchObject({ status: 429, code: "rate_limit_exceeded" })
    expect(Number.isInteger(refused.retryAfter)).toBe(true)
    // One request every 60 s / 6 = 10 s after the burst.
    expect(refused.retryAfter).toBeGreaterThanOrEqual(1)
    expect(refused.retryAfter).toBeLessThanOrEqual(10)
    expect(refused.headers?.get("x-ratelimit-remaining-requests")).toBe("0")
    expect(refused.headers?.get("x-ratelimit-limit-requests")).toBe(String(rpm))
    // Well before Retry-After: still refused (and that refusal costs nothing).
    await sleep(Math.max(0, refused.retryAfter! * 1000 - 1_500))
    expect(
      await refusal(
        client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
      ),
    ).toMatchObject({ status: 429, code: "rate_limit_exceeded" })
    await sleep(refusedAt + refused.retryAfter! * 1000 - Date.now())
    const retried = await client.chat.completions.create({
      model: "swarm-prime",
      messages: MESSAGES,
      max_tokens: 1,
    })
    expect(retried.object).toBe("chat.completion")
    // The other model has its own per-minute limit.
    expect((await usageNow(accountId)).rpm_remaining).toEqual({ "swarm-prime": 0, "swarm-swift": rpm })
  }, 30_000)

  it("the daily quota refuses with Retry-After up to the UTC midnight, capped at 3600", async () => {
    const { key, accountId } = await createKey(server, { limits: { daily: 2 } })
    const client = clientFor(key)
    await client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
    await client.chat.completions.create({ model: "swarm-swift", messages: MESSAGES, max_tokens: 1 })
    const refused = await refusal(
      client.chat.completions.create({ model: "swarm-swift", messages: MESSAGES, max_tokens: 1 }),
    )
    expect(refused).toMatchObject({ status: 429, code: "rate_limit_exceeded" })
    const now = new Date()
    const midnight = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1)
    expect(
      Math.abs(refused.retryAfter! - Math.min(3600, Math.ceil((midnight - now.getTime()) / 1000))),
    ).toBeLessThanOrEqual(2)
    expect(await usageNow(accountId)).toMatchObject({ daily_remaining: 0, weekly_remaining: 50_000 - 2 })
  })
})

describe("concurrency", () => {
  it("a second request while a stream runs gets 429 concurrency_limit_exceeded; aborting the stream frees the slot at once", async () => {
    const { key, accountId } = await createKey(server, { limits: { concurrency: 1, queue: 0 } })
    const client = clientFor(key)
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: LONG,
      max_tokens: 2000,
      stream: true,
    })
    const chunks = stream[Symbol.asyncIterator]()
    expect((await chunks.next()).done).toBe(false)
    expect((await usageNow(accountId)).concurrency).toBe(1)

    const busy = await refusal(
      client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
    )
    expect(busy).toMatchObject({ status: 429, code: "concurrency_limit_exceeded" })
    expect(busy.retryAfter).toBeGreaterThanOrEqual(1)
    expect(busy.retryAfter).toBeLessThanOrEqual(60)

    stream.controller.abort()
    const abortedAt = Date.now()
    while ((await usageNow(accountId)).concurrency !== 0) {
      expect(Date.now() - abortedAt).toBeLessThan(500)
      await sleep(10)
    }
    const next = await client.chat.completions.create({
      model: "swarm-prime",
      messages: MESSAGES,
      max_tokens: 1,
    })
    expect(next.object).toBe("chat.completion")
    expect(await usageNow(accountId)).toMatchObject({ concurrency: 0, queued: 0 })
  }, 30_000)

  it("a queued request runs as soon as the slot frees", async () => {
    const { key, accountId } = await createKey(server, { limits: { concurrency: 1, queue: 1 } })
    const client = clientFor(key)
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: LONG,
      max_tokens: 2000,
      stream: true,
    })
    const chunks = stream[Symbol.asyncIterator]()
    await chunks.next()
    const queued = client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
    let queuedSeen = false
    for (let i = 0; i < 50 && !queuedSeen; i++) {
      queuedSeen = (await usageNow(accountId)).queued === 1
      if (!queuedSeen) await sleep(10)
    }
    expect(queuedSeen).toBe(true)
    stream.controller.abort()
    expect((await queued).object).toBe("chat.completion")
    expect(await usageNow(accountId)).toMatchObject({ concurrency: 0, queued: 0 })
  }, 30_000)

  it("the instance's in-flight bound answers 503 admission_unavailable", async () => {
    const streams = await Promise.all(
      [0, 1].map(async () => {
        const client = clientFor((await createKey(server)).key)
        const stream = await client.chat.completions.create({
          model: "swarm-prime",
          messages: LONG,
          max_tokens: 2000,
          stream: true,
        })
        await stream[Symbol.asyncIterator]().next()
        return stream
      }),
    )
    const third = clientFor((await createKey(server)).key)
    const unavailable = await refusal(
      third.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
    )
    expect(unavailable).toMatchObject({ status: 503, code: "admission_unavailable" })
    expect(unavailable.retryAfter).toBeGreaterThanOrEqual(1)
    expect(unavailable.retryAfter).toBeLessThanOrEqual(60)
    for (const stream of streams) stream.controller.abort()
    await sleep(100)
    expect(
      (await third.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }))
        .object,
    ).toBe("chat.completion")
  }, 30_000)
})

describe("refused after admission: no trace", () => {
  it("a request refused by billing uses no rate-limit token, quota unit or slot", async () => {
    const { key, accountId } = await createKey(server, {
      balance_usd: 0,
      limits: { rpm: 2, daily: 2, concurrency: 1, queue: 0 },
    })
    const client = clientFor(key)
    const before = await usageNow(accountId)
    for (let i = 0; i < 5; i++) {
      const refused = await refusal(
        client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
      )
      expect(refused).toMatchObject({ status: 429, code: "insufficient_quota" })
    }
    expect(await usageNow(accountId)).toEqual(before)
    expect(before).toMatchObject({ concurrency: 0, daily_remaining: 2, rpm_remaining: { "swarm-prime": 2 } })
  })

  it("a request refused by dispatch (429 capacity_exhausted) uses no rate-limit token, quota unit or slot", async () => {
    const empty = await startServer({ SWARMGATE_SIM_NODES: "0" })
    try {
      const { key, accountId } = await createKey(empty, {
        limits: { rpm: 2, daily: 2, concurrency: 1, queue: 0 },
      })
      const client = clientFor(key, empty)
      for (let i = 0; i < 5; i++) {
        const refused = await refusal(
          client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
        )
        expect(refused).toMatchObject({ status: 429, code: "capacity_exhausted" })
        // Not counted, so no counts shown.
        expect(refused.headers?.get("x-ratelimit-remaining-requests")).toBeNull()
      }
      expect(await usageNow(accountId, empty)).toEqual({
        concurrency: 0,
        queued: 0,
        rpm_remaining: { "swarm-prime": 2, "swarm-swift": 2 },
        rph_remaining: { "swarm-prime": 1000, "swarm-swift": 1000 },
        daily_remaining: 2,
        weekly_remaining: 50_000,
      })
    } finally {
      await empty.stop()
    }
  }, 60_000)
})

describe("Redis unreachable", () => {
  it("fails closed: 503 admission_unavailable with Retry-After, nothing else refused", async () => {
    const cut = await startServer({ REDIS_URL: "redis://127.0.0.1:1" })
    try {
      const client = clientFor((await createKey(cut)).key, cut)
      const refused = await refusal(
        client.chat.completions.create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 }),
      )
      expect(refused).toMatchObject({ status: 503, code: "admission_unavailable" })
      expect(refused.retryAfter).toBeGreaterThanOrEqual(1)
      expect(refused.retryAfter).toBeLessThanOrEqual(60)
      expect((await client.models.list()).data.length).toBeGreaterThan(0)
    } finally {
      await cut.stop()
    }
  }, 60_000)

  it("fails open when SWARMGATE_LIMITS_ON_REDIS_FAILURE=open", async () => {
    const cut = await startServer({
      REDIS_URL: "redis://127.0.0.1:1",
      SWARMGATE_LIMITS_ON_REDIS_FAILURE: "open",
    })
    try {
      const client = clientFor((await createKey(cut, { limits: { rpm: 1 } })).key, cut)
      for (let i = 0; i < 2; i++) {
        const { data, response } = await client.chat.completions
          .create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 1 })
          .withResponse()
        expect(data.object).toBe("chat.completion")
        expect(response.headers.get("x-ratelimit-limit-requests")).toBeNull()
      }
    } finally {
      await cut.stop()
    }
  }, 60_000)
})
