/**
 * Soak: `npm run soak -- --minutes N` runs mixed traffic with injected faults
 * against a spawned setup for N minutes and reports, over time, what must stay
 * flat or zero: the gateway's memory (RSS, heap), its open handles and
 * sockets, pending holds, leaked slots (account concurrency and queue, node
 * in-flight, requests in flight) and ledger drift (`swarmgate ledger check`).
 *
 * Setup: two node-sim processes (one behind a TCP fault proxy, with failure
 * rates), the gateway on a temporary SQLite database — or `--database-url`
 * (PostgreSQL, through a fault proxy) and `--redis-url` (through a fault
 * proxy, a fresh key prefix). Traffic: streamed and not, cancelled streams,
 * refusals (bad keys, bad bodies, no money, rate limits). Faults, in turns:
 * node cut, node stall, node latency, and Redis / PostgreSQL cuts when given.
 *
 * At every checkpoint traffic pauses until the gateway is quiet, a full GC
 * runs in it (started with `--expose-gc`; SIGUSR2), then every gauge is read.
 * Writes `reports/soak-<time>.json` and `.html` (SVG charts); exits 1 when a
 * leak, drift or memory growth is found.
 *
 *   --minutes N        duration (default 2)
 *   --interval S       seconds between checkpoints (default: a tenth of the run, 10–60)
 *   --concurrency N    traffic workers (default 8)
 *   --database-url U   PostgreSQL server URL; a fresh database is created on it and dropped after
 *   --redis-url U      Redis URL (limits, money, invalidation shared through it)
 *   --out DIR          report directory (default reports)
 */
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { parseArgs } from "node:util"
import { type FaultProxy, startFaultProxy } from "../apps/server/test/support/FaultProxy"

const root = resolve(import.meta.dirname, "..")
const BIN = join(root, "apps/server/bin/swarmgate.js")
const NODE_SIM = join(root, "apps/node-sim/bin/node-sim.js")
const ADMIN = `soak-${randomBytes(8).toString("hex")}`

const { values: args } = parseArgs({
  options: {
    minutes: { type: "string", default: "2" },
    interval: { type: "string" },
    concurrency: { type: "string", default: "8" },
    "database-url": { type: "string" },
    "redis-url": { type: "string" },
    out: { type: "string", default: "reports" },
  },
})
const minutes = Number(args.minutes)
const durationMillis = minutes * 60_000
const intervalMillis = args.interval
  ? Number(args.interval) * 1_000
  : Math.min(60_000, Math.max(10_000, durationMillis / 10))
const concurrency = Number(args.concurrency)
if (!(minutes > 0) || !(intervalMillis > 0) || !(concurrency > 0)) {
  console.error(
    "usage: npm run soak -- --minutes N [--interval S] [--concurrency N] [--database-url U] [--redis-url U]",
  )
  process.exit(2)
}

const sleep = (millis: number) => new Promise((r) => setTimeout(r, millis))
const log = (message: string) => console.log(`[soak ${new Date().toISOString().slice(11, 19)}] ${message}`)

// --- processes ------------------------------------------------------------------------------

const children: Array<ChildProcess> = []

const spawnUntil = (command: Array<string>, env: Record<string, string>, pattern: RegExp) =>
  new Promise<{ child: ChildProcess; match: RegExpExecArray; output: () => string }>((ok, fail) => {
    const child = spawn(process.execPath, command, {
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    children.push(child)
    let output = ""
    const timer = setTimeout(() => fail(new Error(`${command[0]} did not start:\n${output}`)), 60_000)
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      if (output.length > 200_000) output = output.slice(-100_000)
      const match = pattern.exec(output)
      if (match) {
        clearTimeout(timer)
        ok({ child, match, output: () => output })
      }
    }
    child.stdout?.on("data", onData)
    child.stderr?.on("data", onData)
    child.once("exit", (code) => {
      clearTimeout(timer)
      fail(new Error(`${command[0]} exited with ${code}:\n${output}`))
    })
  })

interface SimNode {
  readonly id: string
  readonly url: string
  readonly capacity: number
  readonly vision: boolean
}

const startNodeSim = async (args: Array<string>) => {
  const { match } = await spawnUntil([NODE_SIM, "--port", "0", ...args], {}, /^(\{"event":"listening".*)$/m)
  return JSON.parse(match[1]!) as { port: number; nodes: Array<SimNode> }
}

const runCli = (databaseUrl: string, cliArgs: Array<string>) =>
  new Promise<{ code: number | null; stdout: string }>((ok) => {
    const child = spawn(process.execPath, [BIN, ...cliArgs], {
      env: { ...process.env, DATABASE_URL: databaseUrl, LOG_LEVEL: "warning" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let stdout = ""
    child.stdout.on("data", (c: Buffer) => {
      stdout += c.toString()
    })
    child.once("close", (code) => ok({ code, stdout }))
  })

// --- setup --------------------------------------------------------------------------------------

const dir = mkdtempSync(join(tmpdir(), "swarmgate-soak-"))
const proxies: Array<FaultProxy> = []
let pgDatabase: { admin: string; url: string; name: string } | undefined

const psql = async (adminUrl: string, statement: string) => {
  // The pg client through @effect/sql would pull the store package in; the CLI-free way is psql.
  const child = spawn("psql", [adminUrl, "-v", "ON_ERROR_STOP=1", "-qc", statement], { stdio: "inherit" })
  const code = await new Promise<number | null>((ok) => child.once("close", ok))
  if (code !== 0) throw new Error(`psql failed: ${statement}`)
}

const cleanup = async () => {
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM")
  await sleep(1_500)
  for (const child of children)
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
  await Promise.all(proxies.map((p) => p.close()))
  if (pgDatabase !== undefined) await psql(pgDatabase.admin, `DROP DATABASE IF EXISTS "${pgDatabase.name}"`)
  rmSync(dir, { recursive: true, force: true })
}

const main = async () => {
  log(`${minutes} min, checkpoints every ${intervalMillis / 1000} s, ${concurrency} workers`)
  const [faulty, steady] = await Promise.all([
    startNodeSim([
      "--nodes",
      "3",
      "--seed",
      "21",
      "--id-prefix",
      "faulty-",
      "--speed",
      "5",
      "--capacity",
      "16",
      "--fail-before-first-token",
      "0.03",
      "--break-mid-stream",
      "0.02",
      "--stall",
      "0.01",
    ]),
    startNodeSim([
      "--nodes",
      "3",
      "--seed",
      "22",
      "--id-prefix",
      "steady-",
      "--speed",
      "5",
      "--capacity",
      "16",
    ]),
  ])
  const nodeProxy = await startFaultProxy({ host: "127.0.0.1", port: faulty.port })
  proxies.push(nodeProxy)
  const entry = (proxy: FaultProxy | undefined) => (n: SimNode) => ({
    id: n.id,
    url: proxy === undefined ? n.url : proxy.rewrite(n.url),
    capacity: n.capacity,
    vision: n.vision,
    models: { "swarm-prime": n.id, "swarm-swift": n.id },
  })
  const nodesFile = join(dir, "nodes.json")
  writeFileSync(
    nodesFile,
    JSON.stringify([...faulty.nodes.map(entry(nodeProxy)), ...steady.nodes.map(entry(undefined))]),
  )

  let databaseUrl = `sqlite:${join(dir, "soak.db")}`
  let gatewayDatabaseUrl = databaseUrl
  let pgProxy: FaultProxy | undefined
  if (args["database-url"] !== undefined) {
    const admin = new URL(args["database-url"])
    const name = `swarmgate_soak_${randomBytes(4).toString("hex")}`
    await psql(admin.toString(), `CREATE DATABASE "${name}"`)
    const url = new URL(admin.toString())
    url.pathname = `/${name}`
    pgDatabase = { admin: admin.toString(), url: url.toString(), name }
    databaseUrl = url.toString()
    pgProxy = await startFaultProxy({ host: url.hostname, port: Number(url.port || 5432) })
    proxies.push(pgProxy)
    gatewayDatabaseUrl = pgProxy.rewrite(databaseUrl)
  }
  let redisProxy: FaultProxy | undefined
  const redisEnv: Record<string, string> = {}
  if (args["redis-url"] !== undefined) {
    const url = new URL(args["redis-url"])
    redisProxy = await startFaultProxy({ host: url.hostname, port: Number(url.port || 6379) })
    proxies.push(redisProxy)
    redisEnv.REDIS_URL = redisProxy.rewrite(args["redis-url"])
    redisEnv.SWARMGATE_REDIS_PREFIX = `soak:${randomBytes(4).toString("hex")}:`
  }

  const gateway = await spawnUntil(
    // SIGUSR2 runs a full GC in the gateway, so heap readings are comparable, not a point on a sawtooth.
    [
      "--expose-gc",
      "--import",
      "data:text/javascript,process.on('SIGUSR2',()=>globalThis.gc())",
      BIN,
      "serve",
    ],
    {
      PORT: "0",
      HOST: "127.0.0.1",
      DATABASE_URL: gatewayDatabaseUrl,
      SWARMGATE_ADMIN_TOKEN: ADMIN,
      SWARMGATE_NODES_FILE: nodesFile,
      SWARMGATE_IDLE_TIMEOUT_MS: "2000",
      SWARMGATE_FIRST_TOKEN_TIMEOUT_MS: "2000",
      SWARMGATE_NODE_CONNECT_TIMEOUT_MS: "2000",
      SWARMGATE_PROBE_INTERVAL_MS: "1000",
      SWARMGATE_CIRCUIT_OPEN_MS: "1000",
      SWARMGATE_LEASE_MS: "3000",
      LOG_LEVEL: "warning",
      ...redisEnv,
    },
    /\{"event":"listening"[^\n]*"port":(\d+)\}/,
  )
  const pid = gateway.child.pid!
  const base = `http://127.0.0.1:${gateway.match[1]}`
  log(
    `gateway pid ${pid} at ${base}; database ${databaseUrl.startsWith("sqlite") ? "SQLite" : "PostgreSQL"}${redisProxy ? ", Redis" : ""}`,
  )

  const admin = async <T>(method: string, path: string, body?: unknown): Promise<T> => {
    const response = await fetch(`${base}/admin/v1${path}`, {
      method,
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    return (await response.json()) as T
  }
  const account = async (body: Record<string, unknown>) => {
    const created = await admin<{ id: string }>("POST", "/accounts", { name: "soak", ...body })
    const key = await admin<{ key: string }>("POST", `/accounts/${created.id}/keys`, {})
    return { id: created.id, key: key.key }
  }
  const unlimited = {
    concurrency: 64,
    queue: 64,
    rpm: 1_000_000,
    rph: 1_000_000,
    daily: 10_000_000,
    weekly: 10_000_000,
  }
  const accounts = {
    main: await account({ balance_usd: 10_000, limits: unlimited }),
    limited: await account({ balance_usd: 100, limits: { ...unlimited, rpm: 20 } }),
    broke: await account({ balance_usd: 0, limits: unlimited }),
  }

  // --- traffic ------------------------------------------------------------------------------------

  const outcomes = new Map<string, number>()
  const count = (what: string) => outcomes.set(what, (outcomes.get(what) ?? 0) + 1)
  let paused = false
  let stopped = false
  let active = 0
  const question = (i: number) => [
    { role: "user", content: `Question ${i % 50}: how do rivers shape valleys?` },
  ]

  const post = (key: string, body: unknown, signal?: AbortSignal) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: typeof body === "string" ? body : JSON.stringify(body),
      ...(signal === undefined ? {} : { signal }),
    })

  const one = async (i: number) => {
    const kind = i % 20
    const model = i % 3 === 0 ? "swarm-swift" : "swarm-prime"
    if (kind < 8) {
      const response = await post(accounts.main.key, {
        model,
        messages: question(i),
        max_tokens: 10 + (i % 50),
      })
      await response.text()
      count(`plain ${response.status}`)
      return response.status
    }
    if (kind < 14) {
      const response = await post(accounts.main.key, {
        model,
        messages: question(i),
        max_tokens: 20 + (i % 80),
        stream: true,
        stream_options: { include_usage: true },
      })
      const text = await response.text()
      const ending = text.endsWith("data: [DONE]\n\n")
        ? "done"
        : text.includes('"upstream_error"')
          ? "error"
          : "other"
      count(`stream ${response.status} ${response.status === 200 ? ending : ""}`.trim())
      return response.status
    }
    if (kind < 16) {
      // Cancelled: read a little, then go away.
      const controller = new AbortController()
      try {
        const response = await post(
          accounts.main.key,
          { model, messages: question(i), max_tokens: 300, stream: true },
          controller.signal,
        )
        const reader = response.body?.getReader()
        await reader?.read()
        await sleep(i % 50)
        controller.abort()
        count("cancelled")
      } catch {
        count("cancelled")
      }
      return 0
    }
    {
      const refusals: Array<[string, () => Promise<Response>]> = [
        [
          "bad key",
          () => post(`sk-swarm-${randomBytes(20).toString("hex")}`, { model, messages: question(i) }),
        ],
        ["bad body", () => post(accounts.main.key, `{"model": "${model}", "messages": [{"role": "robot"`)],
        ["no money", () => post(accounts.broke.key, { model, messages: question(i) })],
        ["rpm 20", () => post(accounts.limited.key, { model, messages: question(i), max_tokens: 5 })],
      ]
      const [label, send] = refusals[i % refusals.length]!
      const response = await send()
      await response.text()
      count(`${label} ${response.status}`)
      return response.status
    }
  }

  const worker = async (w: number) => {
    for (let i = w; !stopped; i += concurrency) {
      while (paused && !stopped) await sleep(50)
      if (stopped) break
      active++
      try {
        // Like a client honouring Retry-After: a refusal storm while Redis is away is not the point.
        if ((await one(i)) === 503) await sleep(250)
      } catch (e) {
        count(`client error ${(e as Error).name}`)
      } finally {
        active--
      }
    }
  }

  // --- faults -------------------------------------------------------------------------------------

  const faults: Array<{ name: string; run: () => Promise<void> }> = [
    {
      name: "node cut 2 s",
      run: async () => {
        nodeProxy.set("cut")
        await sleep(2_000)
        nodeProxy.set("pass")
      },
    },
    {
      name: "node stall 3 s",
      run: async () => {
        nodeProxy.set("stall")
        await sleep(3_000)
        nodeProxy.set("pass")
      },
    },
    {
      name: "node latency 5 s",
      run: async () => {
        nodeProxy.set("latency", { latencyMillis: 80 })
        await sleep(5_000)
        nodeProxy.set("pass")
      },
    },
  ]
  if (redisProxy) {
    const proxy = redisProxy
    faults.push({
      name: "Redis cut 2 s",
      run: async () => {
        proxy.set("cut")
        await sleep(2_000)
        proxy.set("pass")
      },
    })
  }
  if (pgProxy) {
    const proxy = pgProxy
    faults.push({
      name: "PostgreSQL stall 2 s",
      run: async () => {
        proxy.set("stall")
        await sleep(2_000)
        proxy.set("pass")
      },
    })
  }
  const faultLog: Array<{ at: number; name: string }> = []
  let currentFault: Promise<void> = Promise.resolve()
  const injector = async () => {
    for (let n = 0; !stopped; n++) {
      await sleep(intervalMillis / 3)
      if (stopped || paused) continue
      const fault = faults[n % faults.length]!
      faultLog.push({ at: Date.now(), name: fault.name })
      currentFault = fault.run()
      await currentFault
    }
  }

  // --- checkpoints --------------------------------------------------------------------------------

  const metric = (text: string, name: string) => {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
    return line === undefined ? Number.NaN : Number(line.slice(line.lastIndexOf(" ") + 1))
  }
  const sockets = () => {
    let n = 0
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      try {
        if (readlinkSync(`/proc/${pid}/fd/${fd}`).startsWith("socket:")) n++
      } catch {
        // closed while listing
      }
    }
    return n
  }

  interface Sample {
    readonly t: number
    readonly rssMb: number
    readonly heapMb: number
    readonly handles: number
    readonly sockets: number
    readonly fds: number
    readonly heldUsd: number
    readonly slots: number
    readonly queued: number
    readonly nodeInFlight: number
    readonly requestsInFlight: number
    readonly ledgerOk: boolean
    readonly ledgerProblems: number
    readonly outcomes: Record<string, number>
  }
  const samples: Array<Sample> = []
  const started = Date.now()

  const checkpoint = async () => {
    paused = true
    // A fault still on would hold requests: samples are taken with everything healed.
    await currentFault
    const quietBy = Date.now() + 15_000
    while (active > 0 && Date.now() < quietBy) await sleep(50)
    // Let the last settlements, releases and charge writes land.
    let slotsBusy = true
    let tries = 0
    let views: Array<{ held_usd: number; usage_now?: { concurrency: number; queued: number } }> = []
    let nodes: Array<{ in_flight: number }> = []
    while (slotsBusy && tries++ < 40) {
      await sleep(250)
      views = await Promise.all(
        Object.values(accounts).map((a) => admin<(typeof views)[number]>("GET", `/accounts/${a.id}`)),
      )
      nodes = (await admin<{ data: Array<{ in_flight: number }> }>("GET", "/nodes")).data
      slotsBusy =
        views.some((v) => v.held_usd !== 0 || (v.usage_now?.concurrency ?? 0) !== 0) ||
        nodes.some((n) => n.in_flight !== 0)
    }
    process.kill(pid, "SIGUSR2")
    await sleep(500)
    const metrics = await (await fetch(`${base}/metrics`)).text()
    const heapMb = metric(metrics, "swarmgate_nodejs_heap_size_used_bytes") / 2 ** 20
    const ledger = await runCli(databaseUrl, ["ledger", "check"])
    let problems = 0
    try {
      problems = (JSON.parse(ledger.stdout) as { problems: Array<unknown> }).problems.length
    } catch {
      problems = -1
    }
    const status = readFileSync(`/proc/${pid}/status`, "utf8")
    const sample: Sample = {
      t: Math.round((Date.now() - started) / 1000),
      rssMb: Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]) / 1024,
      heapMb,
      handles: metric(metrics, "swarmgate_nodejs_active_handles_total"),
      sockets: sockets(),
      fds: readdirSync(`/proc/${pid}/fd`).length,
      heldUsd: views.reduce((sum, v) => sum + v.held_usd, 0),
      slots: views.reduce((sum, v) => sum + (v.usage_now?.concurrency ?? 0), 0),
      queued: views.reduce((sum, v) => sum + (v.usage_now?.queued ?? 0), 0),
      nodeInFlight: nodes.reduce((sum, n) => sum + n.in_flight, 0),
      requestsInFlight: metric(metrics, "swarmgate_requests_in_flight"),
      ledgerOk: ledger.code === 0,
      ledgerProblems: problems,
      outcomes: Object.fromEntries(outcomes),
    }
    outcomes.clear()
    samples.push(sample)
    log(
      `t=${sample.t}s rss=${sample.rssMb.toFixed(0)}MB heap=${sample.heapMb.toFixed(0)}MB handles=${sample.handles} sockets=${sample.sockets} held=$${sample.heldUsd} slots=${sample.slots}/${sample.queued} node_in_flight=${sample.nodeInFlight} ledger=${sample.ledgerOk ? "ok" : `DRIFT(${sample.ledgerProblems})`} | ${Object.entries(
        sample.outcomes,
      )
        .map(([k, v]) => `${k}:${v}`)
        .join(" ")}`,
    )
    paused = false
  }

  const workers = Array.from({ length: concurrency }, (_, w) => worker(w))
  const faulting = injector()
  while (Date.now() - started < durationMillis) {
    await sleep(Math.min(intervalMillis, durationMillis - (Date.now() - started)))
    await checkpoint()
  }
  stopped = true
  await Promise.all([...workers, faulting])
  await checkpoint()

  // --- verdict and report ---------------------------------------------------------------------------

  const third = Math.max(1, Math.floor(samples.length / 3))
  const median = (xs: Array<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN
  // The first third is warm-up (caches, JIT, pools); compare the middle with the end.
  const middle = samples.slice(third, samples.length - third)
  const end = samples.slice(samples.length - third)
  const growth = (pick: (s: Sample) => number) =>
    median(end.map(pick)) - median((middle.length > 0 ? middle : end).map(pick))
  const floorGrowth = (pick: (s: Sample) => number) =>
    Math.min(...end.map(pick)) - Math.min(...(middle.length > 0 ? middle : end).map(pick))
  const checks = {
    "no pending holds": samples.every((s) => s.heldUsd === 0),
    "no leaked slots": samples.every(
      (s) => s.slots === 0 && s.queued === 0 && s.nodeInFlight === 0 && s.requestsInFlight === 0,
    ),
    "no ledger drift": samples.every((s) => s.ledgerOk),
    "flat heap after GC (< 10% + 16 MB growth, middle → end)":
      growth((s) => s.heapMb) < 0.1 * median(middle.map((s) => s.heapMb)) + 16,
    "flat RSS (< 10% + 32 MB growth, middle → end)":
      growth((s) => s.rssMb) < 0.1 * median(middle.map((s) => s.rssMb)) + 32,
    // Keep-alive pools make sockets come and go with traffic; a leak raises the floor.
    "flat sockets (lowest reading ≤ +8, middle → end)": floorGrowth((s) => s.sockets) <= 8,
    "flat handles (lowest reading ≤ +8, middle → end)": floorGrowth((s) => s.handles) <= 8,
  }
  const ok = Object.values(checks).every(Boolean)
  const totals: Record<string, number> = {}
  for (const s of samples) for (const [k, v] of Object.entries(s.outcomes)) totals[k] = (totals[k] ?? 0) + v
  const report = {
    ok,
    checks,
    minutes,
    intervalSeconds: intervalMillis / 1000,
    concurrency,
    setup: {
      database: databaseUrl.startsWith("sqlite") ? "sqlite" : "postgresql",
      redis: redisProxy !== undefined,
    },
    totals,
    faults: faultLog.map((f) => ({ t: Math.round((f.at - started) / 1000), name: f.name })),
    samples,
  }
  mkdirSync(args.out!, { recursive: true })
  const stamp = new Date().toISOString().replaceAll(":", "-").slice(0, 19)
  const jsonPath = join(args.out!, `soak-${stamp}.json`)
  const htmlPath = join(args.out!, `soak-${stamp}.html`)
  writeFileSync(jsonPath, `${JSON.stringify(report, null, 2)}\n`)
  writeFileSync(htmlPath, html(report))
  for (const [name, passed] of Object.entries(checks)) log(`${passed ? "PASS" : "FAIL"} ${name}`)
  log(
    `requests: ${Object.entries(totals)
      .map(([k, v]) => `${k}:${v}`)
      .join(" ")}`,
  )
  log(`${ok ? "OK" : "FAILED"}: ${jsonPath}, ${htmlPath}`)
  return ok
}

// --- the HTML report ----------------------------------------------------------------------------------

interface ReportShape {
  readonly ok: boolean
  readonly checks: Record<string, boolean>
  readonly minutes: number
  readonly totals: Record<string, number>
  readonly faults: ReadonlyArray<{ t: number; name: string }>
  readonly samples: ReadonlyArray<Record<string, unknown> & { t: number }>
}

const escapeHtml = (s: string) => s.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`)

const chart = (report: ReportShape, title: string, series: Array<[string, string]>) => {
  const width = 640
  const height = 180
  const pad = 36
  const xs = report.samples.map((s) => s.t)
  const maxT = Math.max(1, ...xs)
  const values = series.flatMap(([key]) => report.samples.map((s) => Number(s[key]) || 0))
  const maxV = Math.max(1, ...values) * 1.1
  const x = (t: number) => pad + (t / maxT) * (width - 2 * pad)
  const y = (v: number) => height - pad + 4 - (v / maxV) * (height - 2 * pad)
  const colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
  const lines = series
    .map(([key, label], i) => {
      const points = report.samples
        .map((s) => `${x(s.t).toFixed(1)},${y(Number(s[key]) || 0).toFixed(1)}`)
        .join(" ")
      return `<polyline fill="none" stroke="${colors[i]}" stroke-width="2" points="${points}"/><text x="${pad + 8 + i * 150}" y="14" fill="${colors[i]}" font-size="12">${escapeHtml(label)}</text>`
    })
    .join("")
  const faultMarks = report.faults
    .map(
      (f) =>
        `<line x1="${x(f.t)}" x2="${x(f.t)}" y1="${pad - 10}" y2="${height - pad + 4}" stroke="#ccc" stroke-dasharray="3,3"><title>${escapeHtml(f.name)}</title></line>`,
    )
    .join("")
  return `<h3>${escapeHtml(title)}</h3><svg width="${width}" height="${height}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif">
<line x1="${pad}" y1="${height - pad + 4}" x2="${width - pad}" y2="${height - pad + 4}" stroke="#888"/><line x1="${pad}" y1="${pad - 10}" x2="${pad}" y2="${height - pad + 4}" stroke="#888"/>
<text x="2" y="${pad}" font-size="10">${maxV.toFixed(0)}</text><text x="${width - pad - 20}" y="${height - 8}" font-size="10">${maxT}s</text>
${faultMarks}${lines}</svg>`
}

const html = (report: ReportShape) => `<!doctype html><meta charset="utf-8"><title>swarmgate soak</title>
<body style="font-family:sans-serif;max-width:720px;margin:2em auto">
<h1>swarmgate soak: ${report.ok ? "OK" : "FAILED"} (${report.minutes} min)</h1>
<ul>${Object.entries(report.checks)
  .map(([name, passed]) => `<li>${passed ? "✅" : "❌"} ${escapeHtml(name)}</li>`)
  .join("")}</ul>
<p>Requests: ${Object.entries(report.totals)
  .map(([k, v]) => `${escapeHtml(k)}: ${v}`)
  .join(", ")}</p>
<p>Dashed lines: injected faults (hover for the kind). Samples are taken with traffic paused and the gateway quiet.</p>
${chart(report, "Gateway memory (MB)", [
  ["rssMb", "RSS"],
  ["heapMb", "heap used"],
])}
${chart(report, "Handles, sockets, file descriptors", [
  ["handles", "active handles"],
  ["sockets", "sockets"],
  ["fds", "fds"],
])}
${chart(report, "Leaks (must stay 0)", [
  ["heldUsd", "held USD"],
  ["slots", "slots"],
  ["nodeInFlight", "node in-flight"],
  ["requestsInFlight", "requests in flight"],
  ["ledgerProblems", "ledger problems"],
])}
</body>`

main()
  .then(async (ok) => {
    await cleanup()
    process.exit(ok ? 0 : 1)
  })
  .catch(async (error) => {
    console.error(error)
    await cleanup()
    process.exit(1)
  })
