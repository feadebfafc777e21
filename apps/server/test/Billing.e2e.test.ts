/**
 * Money through the real server process: holds, exact settlement of completed,
 * aborted and refused requests, credits from the admin API and from the CLI,
 * and a crash. After every test `swarmgate ledger check` (its own process)
 * must find the ledger consistent.
 */
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { SqlClient } from "@effect/sql"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "@effect/vitest"
import { Database } from "@swarmgate/store"
import { Effect } from "effect"
import { countTokens } from "gpt-tokenizer"
import OpenAI from "openai"
import {
  accountOf,
  billedKey,
  costOf,
  eventually,
  expectLedgerConsistent,
  micros,
  NO_LIMITS,
  type PriceView,
  priceOf,
  promptTokens,
  runSwarmgate,
  settledLedger,
  usageOf,
} from "./support/Billing"
import { type RunningServer, startServer } from "./support/ServerProcess"

const MESSAGES = [{ role: "user" as const, content: "Explain how rivers shape valleys." }]
const PROMPT = promptTokens(MESSAGES)

let server: RunningServer
let slow: RunningServer
let prime: PriceView

beforeAll(async () => {
  ;[server, slow] = await Promise.all([startServer(), startServer({ SWARMGATE_SIM_SPEED: "1" })])
  prime = await priceOf(server, "swarm-prime")
}, 60_000)

afterAll(async () => {
  await Promise.all([server?.stop(), slow?.stop()])
})

afterEach(async () => {
  await expectLedgerConsistent(server.databaseUrl)
  await expectLedgerConsistent(slow.databaseUrl)
}, 30_000)

const post = (target: RunningServer, key: string, body: Record<string, unknown>) =>
  fetch(`${target.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "swarm-prime", messages: MESSAGES, ...body }),
  })

const worstCase = (maxTokens: number) => costOf(prime, PROMPT, maxTokens)

const expectRefusal = async (response: Response, status: number, type: string, code: string) => {
  const body = (await response.json()) as { error: { type: string; code: string }; request_id: string }
  expect({ status: response.status, type: body.error.type, code: body.error.code }).toEqual({
    status,
    type,
    code,
  })
  expect(response.headers.get("retry-after")).toBeNull()
  return body.request_id
}

describe("prices", () => {
  it("GET /admin/v1/prices lists every preset in USD per million tokens", async () => {
    const prices = await server.admin<{ object: string; data: Array<PriceView> }>("GET", "/prices")
    expect(prices.status).toBe(200)
    expect(prices.body).toEqual({
      object: "list",
      data: [
        { model: "swarm-prime", prompt_usd_per_million: 2.5, completion_usd_per_million: 10 },
        { model: "swarm-swift", prompt_usd_per_million: 0.15, completion_usd_per_million: 0.6 },
      ],
    })
  })
})

describe("settlement", () => {
  it("a completed request is charged exactly the usage the gateway counted", async () => {
    const issued = await billedKey(server, { balance_usd: 1 })
    const client = new OpenAI({ apiKey: issued.key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
    const { data: completion, response } = await client.chat.completions
      .create({ model: "swarm-prime", messages: MESSAGES, max_tokens: 60 })
      .withResponse()
    let streamed: OpenAI.CompletionUsage | undefined
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: MESSAGES,
      max_tokens: 60,
      stream: true,
      stream_options: { include_usage: true },
    })
    for await (const chunk of stream) if (chunk.usage) streamed = chunk.usage

    const usage = await settledLedger(server, issued.accountId, 1_000_000)
    expect(usage).toHaveLength(2)
    const plain = usage.find((u) => u.request_id === response.headers.get("x-request-id"))!
    expect(plain).toMatchObject({
      key_id: issued.keyId,
      model: "swarm-prime",
      prompt_tokens: completion.usage?.prompt_tokens,
      completion_tokens: completion.usage?.completion_tokens,
      outcome: "completed",
    })
    expect(micros(plain.cost_usd)).toBe(costOf(prime, PROMPT, completion.usage!.completion_tokens))
    const other = usage.find((u) => u !== plain)!
    expect(other).toMatchObject({ completion_tokens: streamed?.completion_tokens, outcome: "completed" })
    expect(micros(other.cost_usd)).toBe(costOf(prime, PROMPT, streamed!.completion_tokens))

    const spent = micros(plain.cost_usd) + micros(other.cost_usd)
    const account = await accountOf(server, issued.accountId)
    expect(micros(account.spent_month_usd)).toBe(spent)
    const key = await server.admin<{ spent_usd: number }>("GET", `/keys/${issued.keyId}`)
    expect(micros(key.body.spent_usd)).toBe(spent)
  })

  it("aborting a stream after a few chunks: one usage record, below the cap, charged exactly that", async () => {
    const issued = await billedKey(slow, { balance_usd: 1 })
    const client = new OpenAI({ apiKey: issued.key, baseURL: `${slow.baseUrl}/v1`, maxRetries: 0 })
    const cap = 2_000
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: MESSAGES,
      max_tokens: cap,
      stream: true,
    })
    let received = ""
    let chunks = 0
    for await (const chunk of stream) {
      received += chunk.choices[0]?.delta.content ?? ""
      if (++chunks === 4) break // leaving the loop aborts the request
    }
    expect(received.length).toBeGreaterThan(0)

    const usage = await settledLedger(slow, issued.accountId, 1_000_000)
    expect(usage).toHaveLength(1)
    const record = usage[0]!
    expect(record.outcome).toBe("client_disconnected")
    expect(record.prompt_tokens).toBe(PROMPT)
    expect(record.completion_tokens).toBeGreaterThanOrEqual(countTokens(received))
    expect(record.completion_tokens).toBeLessThan(cap)
    expect(micros(record.cost_usd)).toBe(costOf(prime, PROMPT, record.completion_tokens))
    const account = await accountOf(slow, issued.accountId)
    expect(micros(account.balance_usd)).toBe(1_000_000 - micros(record.cost_usd))
    // It stays at one record: a late settlement cannot add another.
    await new Promise((r) => setTimeout(r, 300))
    expect(await usageOf(slow, issued.accountId)).toHaveLength(1)
  }, 30_000)

  it("a stream in flight holds its worst case; the hold becomes the charge when it ends", async () => {
    const issued = await billedKey(slow, { balance_usd: 1 })
    const response = await post(slow, issued.key, { stream: true, max_tokens: 1_500 })
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    await reader.read()
    const during = await accountOf(slow, issued.accountId)
    expect(micros(during.held_usd)).toBe(worstCase(1_500))
    expect(micros(during.balance_usd)).toBe(1_000_000 - worstCase(1_500))
    await reader.cancel()
    const usage = await settledLedger(slow, issued.accountId, 1_000_000)
    expect(usage).toHaveLength(1)
    expect((await accountOf(slow, issued.accountId)).held_usd).toBe(0)
  }, 30_000)
})

describe("refusals", () => {
  it("a limit that cannot pay the prompt and one token refuses with its code; a refused request leaves no record and no charge", async () => {
    const maxTokens = 100
    // Spec §5.7: the No codes mean the limit itself is too low, not that the worst case does not fit.
    const minimum = worstCase(1)
    const poor = await billedKey(server, { balance_usd: (minimum - 1) / 1e6 })
    const disputed = await billedKey(server, { balance_usd: (minimum - 1) / 1e6 })
    expect(
      (await server.admin("PATCH", `/accounts/${disputed.accountId}`, { payment_hold: true })).status,
    ).toBe(200)
    const monthly = await billedKey(server, { balance_usd: 1, monthly_spend_limit_usd: (minimum - 1) / 1e6 })
    const keyLimited = await billedKey(server, { balance_usd: 1 }, { spend_limit_usd: (minimum - 1) / 1e6 })

    const refused: Array<string> = []
    for (const stream of [false, true]) {
      const body = { max_tokens: maxTokens, stream }
      refused.push(
        await expectRefusal(
          await post(server, poor.key, body),
          429,
          "insufficient_quota",
          "insufficient_quota",
        ),
        await expectRefusal(
          await post(server, disputed.key, body),
          402,
          "insufficient_quota",
          "payment_hold",
        ),
        await expectRefusal(
          await post(server, monthly.key, body),
          402,
          "insufficient_quota",
          "account_spend_limit_reached",
        ),
        await expectRefusal(
          await post(server, keyLimited.key, body),
          429,
          "rate_limit_error",
          "billing_limit_exceeded",
        ),
      )
    }
    // Refused before billing: bad model, bad parameter.
    await expectRefusal(
      await post(server, monthly.key, { model: "swarm-nope" }),
      404,
      "invalid_request_error",
      "model_not_found",
    )
    await expectRefusal(
      await post(server, monthly.key, { n: 2 }),
      400,
      "invalid_request_error",
      "invalid_request",
    )

    for (const issued of [poor, disputed, monthly, keyLimited]) {
      expect(await usageOf(server, issued.accountId)).toEqual([])
      const account = await accountOf(server, issued.accountId)
      expect(account.held_usd).toBe(0)
      expect(account.spent_month_usd).toBe(0)
    }
    expect(micros((await accountOf(server, poor.accountId)).balance_usd)).toBe(minimum - 1)
    expect(micros((await accountOf(server, monthly.accountId)).balance_usd)).toBe(1_000_000)
    expect(refused).toHaveLength(8)
  })

  it("a limit between the minimum and the worst case serves the request, capped at what it pays (finish_reason length)", async () => {
    const cap = 12
    // Enough for the prompt and 12 completion tokens, not 13: each limit in turn.
    const budget = worstCase(cap)
    const byBalance = await billedKey(server, { balance_usd: budget / 1e6 })
    const byMonth = await billedKey(server, { balance_usd: 1, monthly_spend_limit_usd: budget / 1e6 })
    const byKey = await billedKey(server, { balance_usd: 1 }, { spend_limit_usd: budget / 1e6 })
    for (const [issued, credited, status] of [
      [byBalance, budget, 429],
      [byMonth, 1_000_000, 402],
      [byKey, 1_000_000, 429],
    ] as const) {
      const client = new OpenAI({ apiKey: issued.key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
      const completion = await client.chat.completions.create({
        model: "swarm-prime",
        messages: MESSAGES,
        max_tokens: 2_000,
      })
      expect(completion.choices[0]!.finish_reason).toBe("length")
      expect(completion.usage!.completion_tokens).toBe(cap)
      expect(countTokens(completion.choices[0]!.message.content ?? "")).toBe(cap)
      const usage = await settledLedger(server, issued.accountId, credited)
      expect(usage).toHaveLength(1)
      expect(micros(usage[0]!.cost_usd)).toBe(budget)
      // What is left cannot pay the minimum now: a No code, truthfully.
      const again = await post(server, issued.key, { max_tokens: 2_000 })
      expect(again.status).toBe(status)
      await again.body?.cancel()
    }
    // The stream says so too.
    const streamed = await billedKey(server, { balance_usd: budget / 1e6 })
    const client = new OpenAI({ apiKey: streamed.key, baseURL: `${server.baseUrl}/v1`, maxRetries: 0 })
    const stream = await client.chat.completions.create({
      model: "swarm-prime",
      messages: MESSAGES,
      max_tokens: 2_000,
      stream: true,
      stream_options: { include_usage: true },
    })
    let finish: string | null | undefined
    let completionTokens: number | undefined
    for await (const chunk of stream) {
      finish = chunk.choices[0]?.finish_reason ?? finish
      if (chunk.usage) completionTokens = chunk.usage.completion_tokens
    }
    expect([finish, completionTokens]).toEqual(["length", cap])
    await settledLedger(server, streamed.accountId, budget)
  })

  it("when only the account's other running requests hold the money, a request waits for them; with no queue it gets 429 concurrency_limit_exceeded", async () => {
    // One long stream holds all but a few micro-dollars of the balance.
    const longest = 1_500
    const issued = await billedKey(slow, { balance_usd: (worstCase(longest) + 10) / 1e6 })
    const running = await post(slow, issued.key, { stream: true, max_tokens: longest })
    expect(running.status).toBe(200)
    const reader = running.body!.getReader()
    await reader.read()
    // The account may queue: the second request waits, and is served once the stream ends.
    let answered = false
    const waiting = post(slow, issued.key, { max_tokens: 5 }).finally(() => {
      answered = true
    })
    await new Promise((r) => setTimeout(r, 500))
    expect(answered).toBe(false)
    await reader.cancel()
    const served = await waiting
    expect(served.status).toBe(200)
    await served.json()

    // With no queue, the same situation is 429 concurrency_limit_exceeded with Retry-After, never a No code.
    const unqueued = await billedKey(slow, {
      balance_usd: (worstCase(longest) + 10) / 1e6,
      limits: { ...NO_LIMITS, queue: 0 },
    })
    const other = await post(slow, unqueued.key, { stream: true, max_tokens: longest })
    const otherReader = other.body!.getReader()
    await otherReader.read()
    const refused = await post(slow, unqueued.key, { max_tokens: 5 })
    const body = (await refused.json()) as { error: { type: string; code: string } }
    expect({ status: refused.status, ...body.error }).toMatchObject({
      status: 429,
      type: "rate_limit_error",
      code: "concurrency_limit_exceeded",
    })
    expect(refused.headers.get("retry-after")).toBe("1")
    await otherReader.cancel()
    await settledLedger(slow, unqueued.accountId, worstCase(longest) + 10)
  }, 30_000)

  it("credit through the admin API is usable by the very next request", async () => {
    const issued = await billedKey(server, { balance_usd: 0 })
    await expectRefusal(
      await post(server, issued.key, { max_tokens: 20 }),
      429,
      "insufficient_quota",
      "insufficient_quota",
    )
    expect(
      (await server.admin("POST", `/accounts/${issued.accountId}/credits`, { amount_usd: 0.01 })).status,
    ).toBe(200)
    expect((await post(server, issued.key, { max_tokens: 20 })).status).toBe(200)
    await settledLedger(server, issued.accountId, 10_000)
  })

  it("credit through the CLI (another process) reaches the running server", async () => {
    const issued = await billedKey(server, { balance_usd: 0 })
    await expectRefusal(
      await post(server, issued.key, { max_tokens: 20 }),
      429,
      "insufficient_quota",
      "insufficient_quota",
    )
    const credited = await runSwarmgate(server.databaseUrl, [
      "accounts",
      "credit",
      issued.accountId,
      "--amount-usd",
      "0.01",
    ])
    expect(credited.code).toBe(0)
    // A refusal re-reads the balance at most once a second.
    await eventually(async () => (await post(server, issued.key, { max_tokens: 20 })).status === 200, 5_000)
    await settledLedger(server, issued.accountId, 10_000)
  }, 20_000)
})

describe("crash", () => {
  it("a killed server charges nothing for the request in flight; a restart rebuilds the balances", async () => {
    const dir = mkdtempSync(join(tmpdir(), "swarmgate-crash-"))
    const databaseUrl = `sqlite:${join(dir, "crash.db")}`
    try {
      const first = await startServer({ DATABASE_URL: databaseUrl, SWARMGATE_SIM_SPEED: "1" })
      const issued = await billedKey(first, { balance_usd: 1 })
      expect((await post(first, issued.key, { max_tokens: 10 })).status).toBe(200)
      const [done] = await settledLedger(first, issued.accountId, 1_000_000)
      const response = await post(first, issued.key, { stream: true, max_tokens: 2_000 })
      const reader = response.body!.getReader()
      await reader.read()
      expect(micros((await accountOf(first, issued.accountId)).held_usd)).toBe(worstCase(2_000))
      first.process.kill("SIGKILL")
      await new Promise((resolve) => first.process.once("exit", resolve))
      await reader.cancel().catch(() => undefined)
      await first.stop()

      const second = await startServer({ DATABASE_URL: databaseUrl })
      try {
        const account = await accountOf(second, issued.accountId)
        expect(account.held_usd).toBe(0)
        expect(micros(account.balance_usd)).toBe(1_000_000 - micros(done!.cost_usd))
        expect(micros(account.spent_month_usd)).toBe(micros(done!.cost_usd))
        expect(await usageOf(second, issued.accountId)).toHaveLength(1)
      } finally {
        await second.stop()
      }
      await expectLedgerConsistent(databaseUrl)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 60_000)

  it("swarmgate ledger check exits 1 and names the drift when the books do not add up", async () => {
    const dir = mkdtempSync(join(tmpdir(), "swarmgate-drift-"))
    const databaseUrl = `sqlite:${join(dir, "drift.db")}`
    try {
      const created = await runSwarmgate(databaseUrl, [
        "accounts",
        "create",
        "--name",
        "d",
        "--balance-usd",
        "5",
      ])
      expect(created.code).toBe(0)
      const accountId = (JSON.parse(created.stdout) as { id: string }).id
      await expectLedgerConsistent(databaseUrl)
      await Effect.runPromise(
        Effect.flatMap(
          SqlClient.SqlClient,
          (sql) => sql`UPDATE accounts SET balance_micros = balance_micros + 1 WHERE id = ${accountId}`,
        ).pipe(Effect.provide(Database.layer(databaseUrl))),
      )
      const check = await runSwarmgate(databaseUrl, ["ledger", "check"])
      expect(check.code).toBe(1)
      const report = JSON.parse(check.stdout) as { ok: boolean; problems: Array<Record<string, unknown>> }
      expect(report.ok).toBe(false)
      expect(report.problems).toEqual([
        {
          kind: "balance_drift",
          account_id: accountId,
          balance_micros: 5_000_001,
          credits_micros: 5_000_000,
          charges_micros: 0,
        },
      ])
      expect(JSON.parse(check.stderr).error.code).toBe("ledger_drift")
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  }, 30_000)
})
