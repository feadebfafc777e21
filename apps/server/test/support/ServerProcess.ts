/**
 * Starts the real `swarmgate` command on 127.0.0.1 (port 0) in a child
 * process, as a user would, and stops it after the test.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

export const BIN = fileURLToPath(new URL("../../bin/swarmgate.js", import.meta.url))
export const ADMIN_TOKEN = "test-admin-token-0123456789"

export interface RunningServer {
  readonly baseUrl: string
  readonly databaseUrl: string
  readonly process: ChildProcess
  readonly output: () => string
  readonly admin: <T = Record<string, unknown>>(
    method: string,
    path: string,
    body?: unknown,
  ) => Promise<{ status: number; body: T }>
  readonly stop: () => Promise<void>
}

/**
 * Most suites test single-node behaviour (timing, cancellation, hedging,
 * capacity) on swarm-prime, whose shipped strategy is consensus: they get
 * `strategy: single` for it unless they set its strategy themselves or ask for
 * the shipped presets (`SWARMGATE_PRESETS: "{}"`, as Consensus.e2e does).
 */
const presetsFor = (env: Record<string, string>): string => {
  if (env.SWARMGATE_PRESETS === "{}") return "{}"
  const given = JSON.parse(env.SWARMGATE_PRESETS ?? "{}") as Record<string, Record<string, unknown>>
  return JSON.stringify({ ...given, "swarm-prime": { strategy: "single", ...given["swarm-prime"] } })
}

export const startServer = async (env: Record<string, string> = {}): Promise<RunningServer> => {
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-e2e-"))
  const databaseUrl = env.DATABASE_URL ?? `sqlite:${join(dir, "swarmgate.db")}`
  const child = spawn(process.execPath, [BIN, "serve"], {
    env: {
      ...process.env,
      PORT: "0",
      HOST: "127.0.0.1",
      DATABASE_URL: databaseUrl,
      SWARMGATE_ADMIN_TOKEN: ADMIN_TOKEN,
      SWARMGATE_SIM_SPEED: "20",
      LOG_LEVEL: "warning",
      ...env,
      SWARMGATE_PRESETS: presetsFor(env),
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let output = ""
  const port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${output}`)), 30_000)
    child.stdout?.on("data", (chunk: Buffer) => {
      output += chunk.toString()
      const match = /\{"event":"listening"[^\n]*"port":(\d+)\}/.exec(output)
      if (match) {
        clearTimeout(timer)
        resolve(Number(match[1]))
      }
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      output += chunk.toString()
    })
    child.once("exit", (code) => {
      clearTimeout(timer)
      reject(new Error(`server exited with ${code}:\n${output}`))
    })
  })
  const baseUrl = `http://127.0.0.1:${port}`
  return {
    baseUrl,
    databaseUrl,
    process: child,
    output: () => output,
    admin: async (method, path, body) => {
      const response = await fetch(`${baseUrl}/admin/v1${path}`, {
        method,
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, "content-type": "application/json" },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      })
      const text = await response.text()
      return { status: response.status, body: (text.length > 0 ? JSON.parse(text) : undefined) as never }
    },
    stop: async () => {
      // A process killed by a signal keeps exitCode null: it has exited all the same.
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve))
        child.kill("SIGTERM")
        await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))])
        if (child.exitCode === null) child.kill("SIGKILL")
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** An account with a key, through the admin API. */
export const createKey = async (
  server: RunningServer,
  account: Record<string, unknown> = {},
  key: Record<string, unknown> = {},
) => {
  const created = await server.admin<{ id: string }>("POST", "/accounts", {
    name: "e2e",
    balance_usd: 100,
    ...account,
  })
  if (created.status !== 201) throw new Error(`account: ${created.status} ${JSON.stringify(created.body)}`)
  const issued = await server.admin<{ id: string; key: string }>(
    "POST",
    `/accounts/${created.body.id}/keys`,
    key,
  )
  if (issued.status !== 201) throw new Error(`key: ${issued.status} ${JSON.stringify(issued.body)}`)
  return { accountId: created.body.id, keyId: issued.body.id, key: issued.body.key }
}
