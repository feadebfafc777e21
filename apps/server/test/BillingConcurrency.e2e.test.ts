/**
 * 200 simultaneous requests (half streamed) through the real server, on
 * SQLite and on PostgreSQL: no limit is ever overspent, every refusal carries
 * the code of the limit that refused it, and the usage records add up exactly
 * to the money that left the balance. `swarmgate ledger check` agrees.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { TestDatabase } from "@swarmgate/store"
import {
  accountOf,
  billedKey,
  costOf,
  expectLedgerConsistent,
  micros,
  priceOf,
  promptTokens,
  settledLedger,
  temporaryPgDatabase,
} from "./support/Billing"
import { type RunningServer, startServer } from "./support/ServerProcess"

const MESSAGES = [{ role: "user" as const, content: "Name three rivers and the valleys they carved." }]
const MAX_TOKENS = 40
const REQUESTS = 200

interface Result {
  readonly requestId: string
  readonly status: number
  readonly code: string | undefined
}

/** One request, read to the end; streams count as run even when they end in an error event. */
const fire = async (server: RunningServer, key: string, stream: boolean): Promise<Result> => {
  const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "swarm-prime", messages: MESSAGES, max_tokens: MAX_TOKENS, stream }),
  })
  const requestId = response.headers.get("x-request-id") ?? ""
  const text = await response.text()
  const code =
    response.status === 200 ? undefined : (JSON.parse(text) as { error: { code: string } }).error.code
  return { requestId, status: response.status, code }
}

/** Statuses a request may end with before generation for reasons that are not money (no record, no charge). */
const NOT_BILLING = new Set(["capacity_exhausted", "upstream_error", "upstream_timeout"])

interface Scenario {
  readonly name: string
  readonly account: Record<string, unknown>
  readonly key: Record<string, unknown>
  readonly paymentHold?: boolean
  /** The one billing code its refusals may carry. */
  readonly refusal: string
  /** The limit nothing may pass, in micro-dollars: account money or key/month spend. */
  readonly cap: number
}

const run = (
  label: string,
  databaseUrl: () => Promise<{ url: string | undefined; drop: () => Promise<void> }>,
) =>
  describe(label, () => {
    let server: RunningServer
    let drop: () => Promise<void>
    let worst: number

    beforeAll(async () => {
      const database = await databaseUrl()
      drop = database.drop
      server = await startServer(database.url === undefined ? {} : { DATABASE_URL: database.url })
      worst = costOf(await priceOf(server, "swarm-prime"), promptTokens(MESSAGES), MAX_TOKENS)
    }, 60_000)

    afterAll(async () => {
      await server?.stop()
      await drop?.()
    }, 60_000)

    /** Fires `REQUESTS` requests at once, spread over the scenarios, every other one streamed. */
    const storm = async (scenarios: ReadonlyArray<Scenario>) => {
      const principals: Array<{
        scenario: Scenario
        issued: Awaited<ReturnType<typeof billedKey>>
        credited: number
      }> = []
      for (const scenario of scenarios) {
        const issued = await billedKey(server, scenario.account, scenario.key)
        if (scenario.paymentHold) {
          expect(
            (await server.admin("PATCH", `/accounts/${issued.accountId}`, { payment_hold: true })).status,
          ).toBe(200)
        }
        const credited = micros((await accountOf(server, issued.accountId)).balance_usd)
        principals.push({ scenario, issued, credited })
      }
      const results = await Promise.all(
        Array.from({ length: REQUESTS }, (_, i) => {
          const principal = principals[i % principals.length]!
          return fire(server, principal.issued.key, i % 2 === 1).then((result) => ({ principal, result }))
        }),
      )
      for (const principal of principals) {
        const { scenario, issued, credited } = principal
        const mine = results.filter((r) => r.principal === principal).map((r) => r.result)
        const usage = await settledLedger(server, issued.accountId, credited)
        const spent = usage.reduce((sum, u) => sum + micros(u.cost_usd), 0)
        const ok = mine.filter((r) => r.status === 200)
        const refused = mine.filter((r) => r.status !== 200 && !NOT_BILLING.has(r.code ?? ""))
        // Every refusal is the code of this scenario's binding limit.
        expect(new Set(refused.map((r) => `${r.status} ${r.code}`)), scenario.name).toEqual(
          new Set(refused.length > 0 ? [`${scenario.refusal}`] : []),
        )
        expect(refused.length, scenario.name).toBeGreaterThan(0)
        // No overspend.
        expect(spent, scenario.name).toBeLessThanOrEqual(scenario.cap)
        expect(spent, scenario.name).toBeGreaterThan(0)
        // Every run request has exactly one record, no refused one has any.
        const recorded = new Set(usage.map((u) => u.request_id))
        expect(recorded.size).toBe(usage.length)
        for (const r of ok) expect(recorded.has(r.requestId), scenario.name).toBe(true)
        for (const r of refused) expect(recorded.has(r.requestId), scenario.name).toBe(false)
        for (const u of usage) expect(u.key_id).toBe(issued.keyId)
        const account = await accountOf(server, issued.accountId)
        expect(micros(account.balance_usd)).toBe(credited - spent)
        expect(account.held_usd).toBe(0)
        expect(micros(account.spent_month_usd)).toBe(spent)
      }
      await expectLedgerConsistent(server.databaseUrl)
      return results
    }

    it("a key allowing ~10 requests on an account whose balance allows ~8: the balance binds", async () => {
      const balance = 8 * worst + Math.floor(worst / 2)
      const results = await storm([
        {
          name: "balance",
          account: { balance_usd: balance / 1e6 },
          key: { spend_limit_usd: (10 * worst + Math.floor(worst / 2)) / 1e6 },
          refusal: "429 insufficient_quota",
          cap: balance,
        },
      ])
      // The first eight holds always fit; later ones only as earlier runs cost less than their hold.
      expect(results.filter((r) => r.result.status === 200).length).toBeGreaterThanOrEqual(8)
    }, 120_000)

    it("each limit refuses with its own code under load: key, balance, month, payment hold", async () => {
      const slack = Math.floor(worst / 2)
      await storm([
        {
          name: "key spend limit",
          account: { balance_usd: 10 },
          key: { spend_limit_usd: (10 * worst + slack) / 1e6 },
          refusal: "429 billing_limit_exceeded",
          cap: 10 * worst + slack,
        },
        {
          name: "balance",
          account: { balance_usd: (8 * worst + slack) / 1e6 },
          key: {},
          refusal: "429 insufficient_quota",
          cap: 8 * worst + slack,
        },
        {
          name: "monthly spend limit",
          account: { balance_usd: 10, monthly_spend_limit_usd: (6 * worst + slack) / 1e6 },
          key: {},
          refusal: "402 account_spend_limit_reached",
          cap: 6 * worst + slack,
        },
        {
          name: "payment hold",
          account: { balance_usd: (4 * worst + slack) / 1e6 },
          key: {},
          paymentHold: true,
          refusal: "402 payment_hold",
          cap: 4 * worst + slack,
        },
      ])
    }, 120_000)
  })

run("200 concurrent requests on SQLite", async () => ({ url: undefined, drop: async () => {} }))

TestDatabase.describePg(describe, "200 concurrent requests on PostgreSQL", () => {
  run("a fresh database", () => temporaryPgDatabase("swarmgate_billing_e2e"))
})
