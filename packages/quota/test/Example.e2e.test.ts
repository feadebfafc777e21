/**
 * `examples/rate-limit-any-service` as a user runs it: two processes of the
 * program on one Redis, driven over HTTP, with what they print checked too.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { deleteKeys, randomPrefix, redisUrl, requireRedis, skipRedis, warnIfSkipped } from "./support/Redis"

const ROOT = fileURLToPath(new URL("../../..", import.meta.url))
const PROGRAM = "examples/rate-limit-any-service/index.ts"

interface Running {
  readonly child: ChildProcess
  readonly port: number
  readonly lines: () => Array<Record<string, unknown>>
}

const start = (env: Record<string, string>) =>
  new Promise<Running>((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", PROGRAM], {
      cwd: ROOT,
      env: { ...process.env, PORT: "0", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    let err = ""
    const lines = () =>
      out
        .split("\n")
        .filter((line) => line.startsWith("{"))
        .map((line) => JSON.parse(line) as Record<string, unknown>)
    const timer = setTimeout(() => reject(new Error(`the example did not start:\n${out}${err}`)), 20_000)
    child.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString()
      const listening = lines().find((line) => line.event === "listening")
      if (listening !== undefined) {
        clearTimeout(timer)
        resolve({ child, port: Number(listening.port), lines })
      }
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      err += chunk.toString()
    })
    child.once("exit", (code) => {
      clearTimeout(timer)
      reject(new Error(`the example exited with ${code}:\n${out}${err}`))
    })
  })

const stop = async (running: Running | undefined) => {
  if (running === undefined || running.child.exitCode !== null) return
  const exited = new Promise((resolve) => running.child.once("exit", resolve))
  running.child.kill("SIGTERM")
  await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 3_000))])
  if (running.child.exitCode === null) running.child.kill("SIGKILL")
}

const thumbnail = async (running: Running, user: string) => {
  const response = await fetch(`http://127.0.0.1:${running.port}/thumbnail?user=${user}`)
  const retryAfter = response.headers.get("retry-after")
  const body = (await response.json()) as { error?: { code: string } }
  return {
    status: response.status,
    code: body.error?.code,
    retryAfter: retryAfter === null ? null : Number(retryAfter),
  }
}

warnIfSkipped("rate-limit-any-service example")

describe.skipIf(skipRedis)("examples/rate-limit-any-service", () => {
  const prefix = randomPrefix("example")
  let one: Running | undefined
  let two: Running | undefined

  beforeAll(async () => {
    const env = { REDIS_URL: requireRedis("example"), QUOTA_PREFIX: prefix }
    ;[one, two] = await Promise.all([start(env), start(env)])
  }, 30_000)

  afterAll(async () => {
    await Promise.all([stop(one), stop(two)])
    if (redisUrl !== undefined) await deleteKeys(redisUrl, prefix)
  }, 15_000)

  it("two processes share one limit of 3 per 10 s per user", async () => {
    const answers = []
    for (const running of [one!, two!, one!, two!]) answers.push(await thumbnail(running, "alice"))
    expect(answers.slice(0, 3).map((a) => a.status)).toEqual([200, 200, 200])
    expect(answers[3]).toMatchObject({ status: 429, code: "rate_limit_exceeded" })
    // The next of 3 per 10 s comes 3⅓ s after the first, less the time the three took.
    expect(answers[3]!.retryAfter).toBeGreaterThanOrEqual(1)
    expect(answers[3]!.retryAfter).toBeLessThanOrEqual(4)
    expect((await thumbnail(one!, "bob")).status).toBe(200)
  }, 20_000)

  it("one thumbnail at a time per user, across both processes", async () => {
    const [first, second] = await Promise.all([thumbnail(one!, "carol"), thumbnail(two!, "carol")])
    expect([first!.status, second!.status].sort()).toEqual([200, 429])
    expect([first, second].find((a) => a.status === 429)).toMatchObject({
      code: "concurrency_limit_exceeded",
    })
  }, 20_000)

  it("prints one JSON line per request", async () => {
    const printed = [...one!.lines(), ...two!.lines()].filter((line) => line.event === "request")
    expect(
      printed
        .filter((line) => line.user === "alice")
        .map((line) => line.status)
        .sort(),
    ).toEqual([200, 200, 200, 429])
    expect(printed.find((line) => line.status === 429 && line.user === "alice")).toMatchObject({
      code: "rate_limit_exceeded",
      retry_after: expect.any(Number),
    })
  })
})
