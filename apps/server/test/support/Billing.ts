/**
 * Helpers for the billing end-to-end tests: the `swarmgate` CLI as a separate
 * process (`ledger check`, credits), a PostgreSQL database per suite, prices
 * and usage as the admin API shows them.
 */
import { spawn } from "node:child_process"
import { TestDatabase } from "@swarmgate/store"
import { Effect, Exit, Scope } from "effect"
import { countTokens } from "gpt-tokenizer"
import { expect } from "vitest"
import { BIN, createKey, type RunningServer } from "./ServerProcess"

export interface CliResult {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** `swarmgate <args>` against `databaseUrl`, in its own process. */
export const runSwarmgate = (databaseUrl: string, args: ReadonlyArray<string>): Promise<CliResult> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], {
      env: { ...process.env, DATABASE_URL: databaseUrl, LOG_LEVEL: "warning" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (chunk: Buffer) => {
      stdout += chunk.toString()
    })
    child.stderr.on("data", (chunk: Buffer) => {
      stderr += chunk.toString()
    })
    child.once("error", reject)
    child.once("close", (code) => resolve({ code, stdout, stderr }))
  })

/** Runs `swarmgate ledger check` and expects a consistent ledger. */
export const expectLedgerConsistent = async (databaseUrl: string) => {
  const result = await runSwarmgate(databaseUrl, ["ledger", "check"])
  if (result.code !== 0)
    throw new Error(`ledger check failed (${result.code}):\n${result.stdout}\n${result.stderr}`)
  const report = JSON.parse(result.stdout) as {
    ok: boolean
    problems: ReadonlyArray<unknown>
    usage_records: number
  }
  expect(report.problems).toEqual([])
  expect(report.ok).toBe(true)
  return report
}

/** A fresh PostgreSQL database (`TEST_DATABASE_URL`'s server); `drop` after the server using it stopped. */
export const temporaryPgDatabase = async (prefix: string) => {
  const scope = Effect.runSync(Scope.make())
  const url = await Effect.runPromise(Scope.extend(TestDatabase.withTemporaryPgDatabase(prefix), scope))
  return { url, drop: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

export const micros = (usd: number) => Math.round(usd * 1_000_000)

/** The gateway's prompt count for plain-text messages (README: Usage). */
export const promptTokens = (messages: ReadonlyArray<{ content: string }>) =>
  3 + messages.reduce((sum, m) => sum + 3 + countTokens(m.content), 0)

export interface PriceView {
  readonly model: string
  readonly prompt_usd_per_million: number
  readonly completion_usd_per_million: number
}

/** Micro-dollars for a run, as the server prices it (rounded up to a whole micro-dollar). */
export const costOf = (price: PriceView, prompt: number, completion: number) =>
  Math.ceil(
    (prompt * micros(price.prompt_usd_per_million) + completion * micros(price.completion_usd_per_million)) /
      1_000_000,
  )

export const priceOf = async (server: RunningServer, model: string) => {
  const prices = await server.admin<{ data: Array<PriceView> }>("GET", "/prices")
  const price = prices.body.data.find((p) => p.model === model)
  if (price === undefined) throw new Error(`no price for ${model}`)
  return price
}

export interface UsageView {
  readonly request_id: string
  readonly key_id: string
  readonly model: string
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly cost_usd: number
  readonly outcome: string
}

export const usageOf = async (server: RunningServer, accountId: string) =>
  (await server.admin<{ data: Array<UsageView> }>("GET", `/usage?account_id=${accountId}&limit=1000`)).body
    .data

export interface AccountMoneyView {
  readonly balance_usd: number
  readonly held_usd: number
  readonly spent_month_usd: number
}

export const accountOf = async (server: RunningServer, accountId: string) =>
  (await server.admin<AccountMoneyView>("GET", `/accounts/${accountId}`)).body

/** Polls `check` until it holds or `millis` pass. */
export const eventually = async (check: () => Promise<boolean>, millis = 5_000) => {
  const deadline = Date.now() + millis
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time")
    await new Promise((r) => setTimeout(r, 20))
  }
}

/**
 * Waits until every charge is written: the usage records in SQL then add up to
 * exactly what left the balance (the live book counts unwritten charges too).
 */
export const settledLedger = async (server: RunningServer, accountId: string, creditedMicros: number) => {
  let usage: Array<UsageView> = []
  await eventually(async () => {
    const account = await accountOf(server, accountId)
    usage = await usageOf(server, accountId)
    const cost = usage.reduce((sum, u) => sum + micros(u.cost_usd), 0)
    return account.held_usd === 0 && micros(account.balance_usd) === creditedMicros - cost
  })
  return usage
}

/** Limits are another feature: lifted high enough that money is the only gate these tests meet. */
export const NO_LIMITS = {
  concurrency: 10_000,
  queue: 10_000,
  rpm: 1_000_000,
  rph: 1_000_000,
  daily: 1_000_000,
  weekly: 1_000_000,
}

/** An account (with `NO_LIMITS`) and a key, through the admin API. */
export const billedKey = (
  server: RunningServer,
  account: Record<string, unknown> = {},
  key: Record<string, unknown> = {},
) => createKey(server, { limits: NO_LIMITS, ...account }, key)
