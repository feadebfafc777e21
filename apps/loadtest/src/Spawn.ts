/**
 * `--spawn`: the whole setup as child processes — K `node-sim` processes, the
 * `swarmgate` server with a nodes file naming their nodes (or its embedded
 * simulated swarm), and an account with a key made through the admin API —
 * and its teardown. Only the commands are used, never the packages: the load
 * generator stays a client.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import type { SpawnOptions } from "./Options"

export const REPO_ROOT = fileURLToPath(new URL("../../../", import.meta.url))
export const SERVER_BIN = join(REPO_ROOT, "apps/server/bin/swarmgate.js")
export const NODE_SIM_BIN = join(REPO_ROOT, "apps/node-sim/bin/node-sim.js")

export interface Child {
  readonly pid: number
  readonly process: ChildProcess
  readonly output: () => string
  /** SIGTERM, then SIGKILL after `graceMillis`. */
  readonly stop: (graceMillis?: number) => Promise<void>
}

export interface ChildSpec<T> {
  readonly name: string
  /** Node flags before the script (e.g. `--cpu-prof`). */
  readonly nodeArgs?: ReadonlyArray<string> | undefined
  readonly script: string
  readonly args?: ReadonlyArray<string> | undefined
  readonly env?: Readonly<Record<string, string>> | undefined
  /** `taskset -c` CPU list. */
  readonly cpus?: string | undefined
  /** Looks at the output so far; a value means the child is ready. */
  readonly ready: (output: string) => T | undefined
  readonly startMillis?: number | undefined
}

export const startChild = async <T>(spec: ChildSpec<T>): Promise<{ child: Child; ready: T }> => {
  const argv = [...(spec.nodeArgs ?? []), spec.script, ...(spec.args ?? [])]
  // taskset execs node, so the pid is node's own.
  const [command, args] =
    spec.cpus === undefined
      ? [process.execPath, argv]
      : ["taskset", ["-c", spec.cpus, process.execPath, ...argv]]
  const child = spawn(command, args, {
    env: { ...process.env, ...spec.env },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let output = ""
  const ready = await new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${spec.name} did not start:\n${output.slice(-4000)}`)),
      spec.startMillis ?? 60_000,
    )
    const look = () => {
      const value = spec.ready(output)
      if (value !== undefined) {
        clearTimeout(timer)
        resolve(value)
      }
    }
    child.stdout?.on("data", (chunk: Buffer) => {
      if (output.length < 1_000_000) output += chunk.toString()
      look()
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      if (output.length < 1_000_000) output += chunk.toString()
    })
    child.once("exit", (code, signal) => {
      clearTimeout(timer)
      reject(new Error(`${spec.name} exited (${code ?? signal}):\n${output.slice(-4000)}`))
    })
  })
  const exited = () =>
    child.exitCode !== null || child.signalCode !== null
      ? Promise.resolve()
      : new Promise<void>((resolve) => child.once("exit", () => resolve()))
  return {
    ready,
    child: {
      pid: child.pid!,
      process: child,
      output: () => output,
      stop: async (graceMillis = 10_000) => {
        const done = exited()
        child.kill("SIGTERM")
        await Promise.race([done, new Promise((r) => setTimeout(r, graceMillis))])
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGKILL")
          await done
        }
      },
    },
  }
}

const listeningLine = <T>(output: string): T | undefined => {
  const line = output.split("\n").find((l) => l.startsWith('{"event":"listening"'))
  return line === undefined ? undefined : (JSON.parse(line) as T)
}

export interface NodeEntry {
  readonly id: string
  readonly url: string
  readonly capacity: number
  readonly vision: boolean
  readonly models: Readonly<Record<string, string>>
}

export const startNodeSim = (args: ReadonlyArray<string>, cpus?: string) =>
  startChild({
    name: "node-sim",
    script: NODE_SIM_BIN,
    args: ["--port", "0", ...args],
    cpus,
    ready: (output) => listeningLine<{ port: number; nodes: Array<NodeEntry> }>(output),
  })

export interface Gateway {
  readonly baseUrl: string
  readonly adminToken: string
  readonly child: Child
  readonly admin: <T>(method: string, path: string, body?: unknown) => Promise<{ status: number; body: T }>
  /** Stops the server and removes its database. */
  readonly stop: () => Promise<void>
}

export interface GatewaySpec {
  readonly env?: Readonly<Record<string, string>> | undefined
  /** What to run instead of the compiled `swarmgate` (e.g. the sources, under tsx). */
  readonly script?: string | undefined
  readonly nodeArgs?: ReadonlyArray<string> | undefined
  readonly cpus?: string | undefined
}

export const startGateway = async (spec: GatewaySpec = {}): Promise<Gateway> => {
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-loadtest-"))
  const adminToken = randomBytes(24).toString("hex")
  const { child, ready } = await startChild({
    name: "swarmgate",
    script: spec.script ?? SERVER_BIN,
    args: ["serve"],
    nodeArgs: spec.nodeArgs,
    cpus: spec.cpus,
    env: {
      PORT: "0",
      HOST: "127.0.0.1",
      DATABASE_URL: `sqlite:${join(dir, "swarmgate.db")}`,
      SWARMGATE_ADMIN_TOKEN: adminToken,
      LOG_LEVEL: "warn",
      SWARMGATE_DRAIN_MS: "1000",
      ...spec.env,
    },
    ready: (output) => listeningLine<{ port: number }>(output),
  }).catch((error: unknown) => {
    rmSync(dir, { recursive: true, force: true })
    throw error
  })
  const baseUrl = `http://127.0.0.1:${ready.port}`
  const admin = async <T>(method: string, path: string, body?: unknown) => {
    const response = await fetch(`${baseUrl}/admin/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await response.text()
    return { status: response.status, body: (text.length > 0 ? JSON.parse(text) : undefined) as T }
  }
  return {
    baseUrl,
    adminToken,
    child,
    admin,
    stop: async () => {
      await child.stop()
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** Limits far above any load this machine can make, so the limiter admits and only its cost shows. */
export const GENEROUS_LIMITS = {
  rpm: 1_000_000_000,
  rph: 1_000_000_000,
  daily: 1_000_000_000,
  weekly: 1_000_000_000,
  concurrency: 1_000_000,
  queue: 1_000_000,
}

export const createLoadKey = async (
  gateway: Pick<Gateway, "admin">,
): Promise<{ accountId: string; key: string }> => {
  const account = await gateway.admin<{ id: string }>("POST", "/accounts", {
    name: "loadtest",
    balance_usd: 1_000_000,
    limits: GENEROUS_LIMITS,
  })
  if (account.status !== 201)
    throw new Error(`create account: ${account.status} ${JSON.stringify(account.body)}`)
  const key = await gateway.admin<{ key: string }>("POST", `/accounts/${account.body.id}/keys`, {
    name: "loadtest",
  })
  if (key.status !== 201) throw new Error(`create key: ${key.status} ${JSON.stringify(key.body)}`)
  return { accountId: account.body.id, key: key.body.key }
}

/** Waits for `/readyz` (the database answers and a node is usable). */
export const waitReady = async (baseUrl: string, millis = 20_000): Promise<void> => {
  const deadline = Date.now() + millis
  let last = ""
  while (Date.now() < deadline) {
    try {
      const response = await fetch(`${baseUrl}/readyz`)
      last = await response.text()
      if (response.status === 200) return
    } catch (error) {
      last = String(error)
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(`gateway not ready after ${millis} ms: ${last}`)
}

export interface Setup {
  readonly url: string
  readonly key: string
  readonly gatewayPid: number
  readonly nodes: number
  readonly stop: () => Promise<void>
}

export const spawnSetup = async (options: SpawnOptions, concurrency: number): Promise<Setup> => {
  const sims: Array<Child> = []
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-nodes-"))
  let gateway: Gateway | undefined
  const stop = async () => {
    await gateway?.stop()
    await Promise.all(sims.map((sim) => sim.stop(3_000)))
    rmSync(dir, { recursive: true, force: true })
  }
  try {
    const started = await Promise.all(
      Array.from({ length: options.nodeSims }, (_, i) =>
        startNodeSim(
          ["--nodes", String(options.nodesPerSim), "--seed", String(42 + i), ...options.nodeSimArgs],
          options.cpus,
        ),
      ),
    )
    sims.push(...started.map((s) => s.child))
    const nodes = started.flatMap((s) => s.ready.nodes)
    const env: Record<string, string> = {
      // Room for the load asked for: the instance's own bounds are not what is measured.
      SWARMGATE_MAX_IN_FLIGHT: String(Math.max(1024, concurrency * 2)),
      SWARMGATE_DISPATCH_QUEUE_MAX: String(Math.max(256, concurrency * 2)),
    }
    if (nodes.length > 0) {
      const file = join(dir, "nodes.json")
      writeFileSync(file, JSON.stringify(nodes))
      env.SWARMGATE_NODES_FILE = file
    }
    gateway = await startGateway({ env: { ...env, ...options.env }, cpus: options.cpus })
    await waitReady(gateway.baseUrl)
    const { key } = await createLoadKey(gateway)
    return {
      url: `${gateway.baseUrl}/v1/chat/completions`,
      key,
      gatewayPid: gateway.child.pid,
      nodes: nodes.length,
      stop,
    }
  } catch (error) {
    await stop()
    throw error
  }
}
