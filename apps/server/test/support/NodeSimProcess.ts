/**
 * `apps/node-sim` as separate processes for end-to-end tests, and the client
 * side of a chat completion (status, SSE events, comments) as a user sees it.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { fileURLToPath } from "node:url"
import type { RunningServer } from "./ServerProcess"

export const NODE_SIM_BIN = fileURLToPath(new URL("../../../node-sim/bin/node-sim.js", import.meta.url))

export interface SimNodeEntry {
  readonly id: string
  readonly url: string
  readonly capacity: number
  readonly vision: boolean
  readonly models: Readonly<Record<string, string>>
}

export interface NodeSimStats {
  readonly id: string
  readonly inFlight: number
  readonly requests: number
  readonly refusedAtCapacity: number
  readonly aborted: number
}

export interface NodeSimProcess {
  readonly port: number
  readonly nodes: ReadonlyArray<SimNodeEntry>
  readonly process: ChildProcess
  readonly output: () => string
  readonly stats: () => Promise<ReadonlyArray<NodeSimStats>>
  /** SIGKILL: the process dies with its connections, as a crashed node would. */
  readonly kill: () => Promise<void>
  readonly stop: () => Promise<void>
}

export const startNodeSim = async (
  args: ReadonlyArray<string>,
  env: Record<string, string> = {},
): Promise<NodeSimProcess> => {
  const child = spawn(process.execPath, [NODE_SIM_BIN, "--port", "0", ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let output = ""
  const listening = await new Promise<{ port: number; nodes: Array<SimNodeEntry> }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`node-sim did not start:\n${output}`)), 30_000)
    child.stdout?.on("data", (chunk: Buffer) => {
      output += chunk.toString()
      const line = output.split("\n").find((l) => l.startsWith('{"event":"listening"'))
      if (line !== undefined) {
        clearTimeout(timer)
        resolve(JSON.parse(line))
      }
    })
    child.stderr?.on("data", (chunk: Buffer) => {
      output += chunk.toString()
    })
    child.once("exit", (code) => {
      clearTimeout(timer)
      reject(new Error(`node-sim exited with ${code}:\n${output}`))
    })
  })
  const exited = () =>
    child.exitCode !== null || child.signalCode !== null
      ? Promise.resolve()
      : new Promise<void>((resolve) => child.once("exit", () => resolve()))
  const base = `http://127.0.0.1:${listening.port}`
  return {
    port: listening.port,
    nodes: listening.nodes,
    process: child,
    output: () => output,
    stats: async () => ((await (await fetch(`${base}/stats`)).json()) as { data: Array<NodeSimStats> }).data,
    kill: async () => {
      const done = exited()
      child.kill("SIGKILL")
      await done
    },
    stop: async () => {
      const done = exited()
      child.kill("SIGTERM")
      await Promise.race([done, new Promise((r) => setTimeout(r, 3_000))])
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
    },
  }
}

/** Registers node-sim nodes with the gateway for the given presets. */
export const registerNodes = async (
  server: RunningServer,
  nodes: ReadonlyArray<SimNodeEntry>,
  presets: ReadonlyArray<string>,
  extra: Record<string, unknown> = {},
) => {
  for (const node of nodes) {
    const models = Object.fromEntries(presets.map((preset) => [preset, node.id]))
    const response = await server.admin("POST", "/nodes", {
      id: node.id,
      url: node.url,
      capacity: node.capacity,
      vision: node.vision,
      models,
      ...extra,
    })
    if (response.status !== 201 && response.status !== 200)
      throw new Error(`register ${node.id}: ${response.status} ${JSON.stringify(response.body)}`)
  }
}

export const drainNodes = async (server: RunningServer, nodes: ReadonlyArray<{ id: string }>) => {
  for (const node of nodes) await server.admin("DELETE", `/nodes/${encodeURIComponent(node.id)}`)
}

export interface NodeView {
  readonly id: string
  readonly source: string
  readonly state: string
  readonly circuit: "closed" | "open" | "half_open"
  readonly in_flight: number
  readonly capacity: number
  readonly requests: number
  readonly failures: number
  readonly error_rate: number
  readonly ttft_ms: number | null
  readonly ttft_p95_ms: number | null
  readonly tokens_per_second: number | null
  readonly reputation: number
  readonly hedges: number
  readonly last_failure: string | null
  readonly expires_at: number | null
  readonly models: Readonly<Record<string, string>>
}

export const nodesOf = async (server: RunningServer) =>
  (await server.admin<{ data: Array<NodeView> }>("GET", "/nodes")).body.data

export interface ChatResult {
  readonly status: number
  readonly headers: Headers
  /** Parsed `data:` events (the error event included), without [DONE]. */
  readonly events: ReadonlyArray<Record<string, unknown>>
  /** Comment lines (`: keep-alive`), in order, with the index of the data event they preceded. */
  readonly comments: ReadonlyArray<{ readonly text: string; readonly before: number }>
  readonly done: boolean
  readonly text: string
  readonly body: Record<string, unknown> | undefined
}

/** One chat completion over raw HTTP, streamed or not, read to its end. */
export const chat = async (
  baseUrl: string,
  key: string,
  body: Record<string, unknown>,
): Promise<ChatResult> => {
  const response = await fetch(`${baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  })
  const raw = await response.text()
  if (!(response.headers.get("content-type") ?? "").startsWith("text/event-stream")) {
    const parsed = raw.length > 0 ? (JSON.parse(raw) as Record<string, unknown>) : undefined
    const choices = parsed?.choices as Array<{ message: { content: string } }> | undefined
    return {
      status: response.status,
      headers: response.headers,
      events: [],
      comments: [],
      done: false,
      text: choices?.[0]?.message.content ?? "",
      body: parsed,
    }
  }
  const events: Array<Record<string, unknown>> = []
  const comments: Array<{ text: string; before: number }> = []
  let done = false
  for (const frame of raw.split("\n\n")) {
    if (frame.length === 0) continue
    if (frame.startsWith(":")) comments.push({ text: frame.slice(1).trim(), before: events.length })
    else if (frame === "data: [DONE]") done = true
    else if (frame.startsWith("data: ")) events.push(JSON.parse(frame.slice(6)) as Record<string, unknown>)
  }
  const text = events
    .map((e) => (e.choices as Array<{ delta?: { content?: string } }> | undefined)?.[0]?.delta?.content ?? "")
    .join("")
  return { status: response.status, headers: response.headers, events, comments, done, text, body: undefined }
}

/** Runs `count` tasks with at most `concurrency` at a time. */
export const pool = async <T>(count: number, concurrency: number, task: (i: number) => Promise<T>) => {
  const results: Array<T> = new Array(count)
  let next = 0
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) {
        const i = next++
        results[i] = await task(i)
      }
    }),
  )
  return results
}

export const until = async (check: () => Promise<boolean>, millis: number, step = 50) => {
  const deadline = Date.now() + millis
  while (!(await check())) {
    if (Date.now() > deadline) return false
    await new Promise((r) => setTimeout(r, step))
  }
  return true
}
