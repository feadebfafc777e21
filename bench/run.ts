/**
 * `npm run bench`: swarmgate against a bare Node.js proxy and a direct node,
 * on this machine's two cores — the process under test alone on core 1, the
 * load generator (this process) and the upstream node on core 0.
 *
 * Sections (all by default; `--only main,counts,gc,crosscheck,ablation,profile,components,streams,sim,nodes`):
 *   main        JSON, SSE 20 and SSE 200 chunks: direct / bare proxy (undici) /
 *               bare proxy (fetch) / swarmgate — throughput and CPU at 32
 *               connections, latency at one; three rounds, each row its
 *               target's median round
 *   crosscheck  the JSON cases again with autocannon, to check our load generator
 *               (bench/Autocannon.ts), to check the generator against other clients
 *   ablation    swarmgate with access logs on, and with hedging and its timeouts off
 *   components  Effect primitives and the HTTP node transport alone (bench/components.ts), and
 *               the same Effect programs on Effect 3 and Effect 4 (bench/effect-runtimes.mjs)
 *   streams     10 → 2,000 concurrent paced streams (20 tokens/s each)
 *   sim         1,000 streams on the embedded simulated swarm (tokens/s per core)
 *   nodes       10 → 1,000 embedded simulated nodes at a fixed load, in three
 *               rounds (every pool size running at once)
 *   profile     `--cpu-prof` of the gateway during JSON and SSE-200 cases
 *
 * Writes bench/results/{results.json,results.md,*.svg} and the tables of
 * BENCHMARKS.md (between its bench markers). `--quick` shortens everything
 * for a trial run and writes to reports/bench-quick instead; `--wait-quiet`
 * first waits (up to 15 minutes) for the machine's load average to drop.
 * `--rerender FILE` measures nothing: it writes the report and the charts
 * beside a run's results.json again (and, for the committed
 * bench/results/results.json, the tables of BENCHMARKS.md), as this code
 * reads them now.
 */
import { execFileSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { type AddressInfo, createServer } from "node:net"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { parseArgs } from "node:util"
import { lineSvg } from "../apps/loadtest/src/Charts"
import type { ClientKind, LoadOptions } from "../apps/loadtest/src/Options"
import { run } from "../apps/loadtest/src/Runner"
import {
  type Child,
  createLoadKey,
  type Gateway,
  REPO_ROOT,
  startChild,
  startGateway,
  waitReady,
} from "../apps/loadtest/src/Spawn"
import { measureAutocannon } from "./Autocannon"
import { type GcRow, gcRow, gcTable, observedCollections, watchCollections } from "./Collections"
import {
  type InstructionsCase,
  type InstructionsRow,
  instructionsTable,
  measureInstructions,
  valgrindAvailable,
} from "./Instructions"
import { CORE_GENERATOR, idlePercent, type Measured, measure, pinAll } from "./Measure"
import { cpuMicros as cpuMicrosOf, loadAverage, machine, pin } from "./Procfs"
import { readProfile, summarize as summarizeProfile } from "./profile-summary"
import {
  ablationTable,
  type CrossCheck,
  crossCheckTable,
  fmt,
  latencyTable,
  type NodesRow,
  nodesTable,
  type ProfileEntry,
  profileTable,
  type Row,
  requestsPerCore,
  streamsTable,
  type Target,
  targetsTable,
  throughputTable,
} from "./Tables"

const { values } = parseArgs({
  options: {
    quick: { type: "boolean" },
    only: { type: "string" },
    "wait-quiet": { type: "boolean" },
    out: { type: "string" },
    rerender: { type: "string" },
  },
})
const quick = values.quick === true
const sections = new Set(
  (values.only ?? "main,counts,gc,crosscheck,ablation,profile,components,streams,sim,nodes").split(","),
)
const OUT = values.out ?? join(REPO_ROOT, quick ? "reports/bench-quick" : "bench/results")
const RAW = join(REPO_ROOT, "reports", `bench-${new Date().toISOString().replace(/[:.]/g, "-")}`)
const BENCH = join(REPO_ROOT, "bench")
const seconds = (s: number) => Math.round(s * (quick ? 0.4 : 1) * 1000)
const log = (text: string) =>
  process.stderr.write(`[bench ${((Date.now() - T0) / 1000).toFixed(0)}s] ${text}\n`)
const T0 = Date.now()

const children: Array<Child> = []
const gateways: Array<Gateway> = []

const listening = (output: string) => {
  const line = output.split("\n").find((l) => l.startsWith('{"event":"listening"'))
  return line === undefined ? undefined : (JSON.parse(line) as { port: number })
}

const startScript = async (name: string, script: string, args: ReadonlyArray<string>) => {
  const { child, ready } = await startChild({
    name,
    nodeArgs: ["--import", "tsx"],
    script: join(BENCH, script),
    args,
    cpus: String(CORE_GENERATOR),
    ready: listening,
  })
  children.push(child)
  return { child, url: `http://127.0.0.1:${ready.port}` }
}

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as AddressInfo).port
      server.close(() => resolve(port))
    })
  })

/**
 * The Portkey OSS gateway (a devDependency), headless, on this machine only: it
 * proxies to `upstream` as a custom OpenAI host, named per request by headers.
 */
const startPortkey = async (upstream: string) => {
  const port = await freePort()
  const { child } = await startChild({
    name: "portkey",
    script: join(REPO_ROOT, "node_modules/@portkey-ai/gateway/build/start-server.js"),
    args: [`--port=${port}`, "--headless"],
    env: { NODE_ENV: "production" },
    cpus: String(CORE_GENERATOR),
    ready: (output) => (output.includes("Ready for connections") ? true : undefined),
  })
  children.push(child)
  return {
    child,
    url: `http://127.0.0.1:${port}`,
    headers: { "x-portkey-provider": "openai", "x-portkey-custom-host": `${upstream}/v1` },
  }
}

const stopChild = async (child: Child) => {
  children.splice(children.indexOf(child), 1)
  await child.stop(5000)
}

interface GatewaySetup {
  readonly gateway: Gateway
  readonly key: string
}

const startSwarmgate = async (
  env: Record<string, string>,
  nodeArgs: ReadonlyArray<string> = [],
): Promise<GatewaySetup> => {
  const gateway = await startGateway({
    cpus: String(CORE_GENERATOR),
    nodeArgs,
    env: {
      SWARMGATE_MAX_IN_FLIGHT: "8192",
      SWARMGATE_DISPATCH_QUEUE_MAX: "8192",
      LOG_LEVEL: "warn",
      // Per-request overhead against one node: swarm-prime's shipped consensus fans out to k nodes by design.
      SWARMGATE_PRESETS: JSON.stringify({ "swarm-prime": { strategy: "single" } }),
      ...env,
    },
  })
  gateways.push(gateway)
  await waitReady(gateway.baseUrl)
  const { key } = await createLoadKey(gateway)
  return { gateway, key }
}

const stopSwarmgate = async (setup: GatewaySetup) => {
  gateways.splice(gateways.indexOf(setup.gateway), 1)
  await setup.gateway.stop()
}

const nodesFile = (url: string, id: string) => {
  const dir = join(tmpdir(), `swarmgate-bench-${process.pid}`)
  mkdirSync(dir, { recursive: true })
  const file = join(dir, `${id}.json`)
  writeFileSync(
    file,
    JSON.stringify([
      { id, url, models: { "swarm-prime": id, "swarm-swift": id }, capacity: 100_000, vision: false },
    ]),
  )
  return file
}

interface Endpoint {
  readonly target: string
  readonly url: string
  readonly key: string
  readonly model: string
  readonly pid: number
  readonly headers?: Readonly<Record<string, string>> | undefined
}

interface Mode {
  readonly name: string
  readonly stream: boolean
  readonly chunks: number
  /** A system message before the user's. */
  readonly system?: string | undefined
}

const MODES: ReadonlyArray<Mode> = [
  { name: "json", stream: false, chunks: 20 },
  { name: "sse-20", stream: true, chunks: 20 },
  { name: "sse-200", stream: true, chunks: 200 },
]

/**
 * JSON with a 4,000-character system prompt, the same on every request, as a chat
 * application sends its instructions with each: a gateway that counts prompt tokens
 * counts it once and then remembers it (the case of a shared system prompt; a
 * conversation's newest message is new each turn). Main section only.
 */
const LONG_PROMPT: Mode = {
  name: "json-long",
  stream: false,
  chunks: 20,
  system:
    "You answer questions about rivers, valleys and the history of the places they shape. Be precise, cite what you know, say when you do not know, and keep each answer short. "
      .repeat(30)
      .slice(0, 4_000),
}

const MAIN_MODES: ReadonlyArray<Mode> = [...MODES, LONG_PROMPT]

/** swarmgate on PostgreSQL + Redis (`DATABASE_URL`, `REDIS_URL`), as many instances would run it. */
const SCALED_OUT = "swarmgate (scaled out)"

const loadOptions = (
  endpoint: Endpoint,
  mode: Mode,
  concurrency: number,
  durationMillis: number,
  warmupMillis: number,
  client: ClientKind = "undici",
  over: Partial<LoadOptions> = {},
): LoadOptions => {
  const prompt = `Say the word the, over and over. chunks=${mode.chunks}`
  return {
    url: `${endpoint.url}/v1/chat/completions`,
    key: endpoint.key,
    headers: endpoint.headers,
    model: endpoint.model,
    stream: mode.stream,
    maxTokens: 256,
    prompt,
    // With a system message the body's messages replace the prompt's one (Runner.requestBody).
    extra:
      mode.system === undefined
        ? {}
        : {
            messages: [
              { role: "system", content: mode.system },
              { role: "user", content: prompt },
            ],
          },
    concurrency,
    rate: undefined,
    durationMillis,
    warmupMillis,
    timeoutMillis: 60_000,
    client,
    slo: undefined,
    seed: 1,
    ...over,
  }
}

const rawResults: Array<{ id: string; measured: Measured }> = []

const toRow = (id: string, endpoint: Endpoint, mode: string, measured: Measured): Row => {
  rawResults.push({ id, measured })
  const r = measured.result
  const us = (ms: number) => ms * 1000
  return {
    mode,
    target: endpoint.target,
    concurrency: r.config.concurrency,
    client: r.config.client,
    rps: r.requests.throughput_rps,
    chunksPerSecond: r.tokens.chunks_per_s,
    outputTps: r.tokens.output_tps,
    cpuMicrosPerRequest: measured.cpuMicrosPerRequest,
    cpuMicrosPerChunk: measured.cpuMicrosPerChunk,
    cpuPercent: measured.cpuPercent,
    foreignPercent: measured.foreignPercent,
    rssMiB: measured.rssMiB,
    hwmMiB: measured.hwmMiB,
    generatorCpuPercent: r.client.cpu_percent,
    inFlightAtEnd: r.client.in_flight_at_end,
    streamingAtEnd: r.client.streaming_at_end,
    errors: r.errors,
    failed: r.requests.failed,
    total: r.requests.total,
    e2eP50: us(r.latency_ms.e2e.p50),
    e2eP99: us(r.latency_ms.e2e.p99),
    ttftP50: us(r.latency_ms.ttft.p50),
    ttftP99: us(r.latency_ms.ttft.p99),
    itlP50: us(r.latency_ms.itl.p50),
    itlP99: us(r.latency_ms.itl.p99),
    tpotP50: us(r.latency_ms.tpot.p50),
  }
}

/** A sort key with what cannot be measured (NaN: a run with no success) after every measured value. */
const measuredFirst = (value: number) => (Number.isNaN(value) ? Number.POSITIVE_INFINITY : value)

/** The run with the median of `by`, as a whole (its other readings belong to it); of an even count, the upper one. */
const medianBy = <T>(rows: ReadonlyArray<T>, by: (row: T) => number): T =>
  [...rows].sort((a, b) => measuredFirst(by(a)) - measuredFirst(by(b)))[Math.floor(rows.length / 2)]!

/** The run with the median throughput, as a whole (its latency and CPU belong to it). */
const median = <T extends { readonly rps: number }>(rows: ReadonlyArray<T>): T => medianBy(rows, (r) => r.rps)

/** Rounds of the main section: each row of its tables is its target's median round (odd: one middle round). */
const MAIN_ROUNDS = 3
/** Rounds of the nodes section, likewise. */
const NODES_ROUNDS = 3

/** The failures and errors of all `rows` together, so that a median round hides none. */
const failuresOf = (rows: ReadonlyArray<Row>): Pick<Row, "errors" | "failed" | "total"> => {
  const errors: Record<string, number> = {}
  for (const row of rows)
    for (const [kind, n] of Object.entries(row.errors)) errors[kind] = (errors[kind] ?? 0) + n
  return {
    errors,
    failed: rows.reduce((sum, r) => sum + r.failed, 0),
    total: rows.reduce((sum, r) => sum + r.total, 0),
  }
}

/** One round of one target in the main section. */
type RoundRow = Row & { readonly round: number }

const allPids = () => [...children.map((c) => c.pid), ...gateways.map((g) => g.child.pid)]

const measureRow = async (id: string, endpoint: Endpoint, mode: string, options: LoadOptions) => {
  const measured = await measure(
    options,
    endpoint.pid,
    allPids().filter((p) => p !== endpoint.pid),
  )
  const row = toRow(id, endpoint, mode, measured)
  log(
    `${id}: ${fmt(row.rps)} req/s, ${fmt(row.cpuMicrosPerRequest)} CPU µs/req, E2E p50 ${fmt(row.e2eP50)} µs, errors ${row.failed}`,
  )
  // A moment for the last aborted requests to settle before the next case.
  await new Promise((r) => setTimeout(r, 300))
  return row
}

/** `--wait-quiet`: up to 15 minutes for other tenants of the machine to finish (1-minute load ≤ 1.5). */
const waitForQuiet = async () => {
  if (values["wait-quiet"] !== true) return
  for (let i = 0; i < 15 && loadAverage()[0] > 1.5; i++) {
    log(`load average ${loadAverage()[0]} > 1.5: waiting 60 s (${i + 1}/15)`)
    await new Promise((r) => setTimeout(r, 60_000))
  }
}

const main = async () => {
  pin(process.pid, String(CORE_GENERATOR))
  mkdirSync(OUT, { recursive: true })
  mkdirSync(RAW, { recursive: true })
  await waitForQuiet()
  const started = Date.now()
  const loadBefore = loadAverage()
  log(`load average ${loadBefore.join(" ")}; sections ${[...sections].join(",")}`)

  const main: Array<Row> = []
  const mainRounds: Array<RoundRow> = []
  const cross: Array<CrossCheck> = []
  const ablation: Array<Row> = []
  const components: Array<ComponentCost> = []
  const effectRuntimes: Array<EffectRuntimeRun> = []
  const streams: Array<Row> = []
  const sim: Array<Row> = []
  const nodes: Array<NodesRow> = []
  const profiles: Array<ProfileResult> = []
  const counts: Array<CountRow> = []
  const gc: Array<GcRow> = []
  const instructions: Array<InstructionsRow> = []

  if (
    ["main", "gc", "crosscheck", "ablation", "profile", "components"].some((section) => sections.has(section))
  ) {
    const instant = await startScript("instant node", "instant-node.ts", ["--port", "0"])
    const proxy = await startScript("bare proxy", "proxy.ts", ["--port", "0", "--upstream", instant.url])
    const proxyFetch = await startScript("bare proxy (fetch)", "proxy.ts", [
      "--port",
      "0",
      "--upstream",
      instant.url,
      "--client",
      "fetch",
    ])
    const file = nodesFile(instant.url, "instant")
    const swarmgate = await startSwarmgate({ SWARMGATE_NODES_FILE: file })
    const portkey = await startPortkey(instant.url)
    // The scaled-out mode (PostgreSQL + Redis) beside the embedded one, in the main section only.
    const scaled = sections.has("main") ? await scaledOut() : undefined
    const swarmgateScaled =
      scaled === undefined ? undefined : await startSwarmgate({ SWARMGATE_NODES_FILE: file, ...scaled.env })
    const endpoints: ReadonlyArray<Endpoint> = [
      { target: "direct", url: instant.url, key: "none", model: "instant", pid: instant.child.pid },
      { target: "bare proxy", url: proxy.url, key: "none", model: "instant", pid: proxy.child.pid },
      {
        target: "bare proxy (fetch)",
        url: proxyFetch.url,
        key: "none",
        model: "instant",
        pid: proxyFetch.child.pid,
      },
      {
        target: "swarmgate",
        url: swarmgate.gateway.baseUrl,
        key: swarmgate.key,
        model: "swarm-prime",
        pid: swarmgate.gateway.child.pid,
      },
      ...(swarmgateScaled === undefined
        ? []
        : [
            {
              target: SCALED_OUT,
              url: swarmgateScaled.gateway.baseUrl,
              key: swarmgateScaled.key,
              model: "swarm-prime",
              pid: swarmgateScaled.gateway.child.pid,
            },
          ]),
      {
        target: "Portkey",
        url: portkey.url,
        key: "none",
        model: "instant",
        pid: portkey.child.pid,
        headers: portkey.headers,
      },
    ]
    const sat = { c: 32, duration: seconds(4), warmup: seconds(1.5) }
    const one = { duration: seconds(3), warmup: seconds(1) }
    /** The main section's loaded rounds: three windows of 3 s rather than one of 4. */
    const satRound = { ...sat, duration: seconds(3) }

    if (sections.has("main")) {
      log("section main")
      // Every target's first seconds on a path run cold code (JIT tiers, lazily loaded modules, a young heap
      // still growing): each is warmed on each mode before any measured case. Warming swarmgate on SSE alone
      // left its JSON path cold — measured first, it cost ~1.4x its steady state.
      // json-long measures the prompt-count cache, the same in both modes: not run scaled out (the suite's time).
      const skipped = (mode: Mode, endpoint: Endpoint) =>
        (mode.stream && endpoint.target === "Portkey") ||
        (mode === LONG_PROMPT && endpoint.target === SCALED_OUT)
      for (const mode of MAIN_MODES)
        for (const endpoint of endpoints) {
          if (skipped(mode, endpoint)) continue
          await run(loadOptions(endpoint, mode, sat.c, seconds(2), 0))
        }
      // Each mode in MAIN_ROUNDS rounds, every target once per round: a few seconds of another tenant on
      // core 1 then falls on one round of each target, and each row is its target's median round.
      for (const mode of MAIN_MODES) {
        const measured = endpoints
          .filter((endpoint) => !skipped(mode, endpoint))
          .map((endpoint) => ({ endpoint, loaded: [] as Array<Row>, single: [] as Array<Row> }))
        for (let round = 0; round < MAIN_ROUNDS; round++)
          for (const { endpoint, loaded, single } of measured) {
            const id = (c: number) => `${mode.name} ${endpoint.target} c=${c} #${round + 1}`
            // The same warm-up in every round: each run opens new connections, after which V8 deoptimises
            // and recompiles some of Node's socket code for a few seconds (BENCHMARKS.md, seventh session).
            loaded.push(
              await measureRow(
                id(satRound.c),
                endpoint,
                mode.name,
                loadOptions(endpoint, mode, satRound.c, satRound.duration, satRound.warmup),
              ),
            )
            single.push(
              await measureRow(
                id(1),
                endpoint,
                mode.name,
                loadOptions(endpoint, mode, 1, one.duration, one.warmup),
              ),
            )
          }
        for (const { loaded, single } of measured) {
          mainRounds.push(...loaded.map((row, round) => ({ ...row, round })))
          mainRounds.push(...single.map((row, round) => ({ ...row, round })))
          // Throughput, CPU and memory from the loaded round of median CPU; latency from the one-connection
          // round of median p99; failures and errors from every round, so that none is hidden by a median.
          const cpu = medianBy(loaded, (r) => r.cpuMicrosPerRequest)
          const latency = medianBy(single, (r) => r.e2eP99)
          main.push({
            ...cpu,
            ...failuresOf([...loaded, ...single]),
            e2eP50: latency.e2eP50,
            e2eP99: latency.e2eP99,
            ttftP50: latency.ttftP50,
            ttftP99: latency.ttftP99,
            itlP50: latency.itlP50,
            itlP99: latency.itlP99,
            tpotP50: latency.tpotP50,
          })
        }
      }
    }

    if (sections.has("crosscheck")) {
      log("section crosscheck")
      const json = MODES[0]!
      const cases = [
        { endpoint: endpoints[0]!, c: 1 },
        { endpoint: endpoints[0]!, c: sat.c },
        { endpoint: endpoints[1]!, c: 1 },
        { endpoint: endpoints[1]!, c: sat.c },
        { endpoint: endpoints[3]!, c: 1 },
      ]
      for (const { endpoint, c } of cases) {
        // Alternated three times and the median kept: other tenants come and go within seconds.
        const ours: Array<Row> = []
        const cannon: Array<CrossCheck["autocannon"]> = []
        for (let round = 0; round < 3; round++) {
          const id = (client: string) => `crosscheck ${endpoint.target} c=${c} ${client} #${round + 1}`
          const options = loadOptions(endpoint, json, c, seconds(c === 1 ? 2 : 3), seconds(1))
          ours.push(await measureRow(id("undici"), endpoint, "json", options))
          const measured = await measureAutocannon(
            options,
            endpoint.pid,
            allPids().filter((p) => p !== endpoint.pid),
          )
          cannon.push(measured)
          log(
            `${id("autocannon")}: ${fmt(measured.rps)} req/s, ${fmt(measured.cpuMicrosPerRequest)} CPU µs/req, E2E p50 ${fmt(measured.e2eP50)} µs, non-2xx ${measured.non2xx}, errors ${measured.errors}`,
          )
          await new Promise((r) => setTimeout(r, 300))
        }
        cross.push({ undici: median(ours), autocannon: median(cannon) })
      }
    }
    await stopSwarmgate(swarmgate)
    if (swarmgateScaled !== undefined) await stopSwarmgate(swarmgateScaled)
    await scaled?.cleanup()

    if (sections.has("ablation")) {
      log("section ablation: the same gateway with parts of the path switched off by configuration")
      const variants: ReadonlyArray<{
        name: string
        env: Record<string, string>
        modes: ReadonlyArray<Mode>
      }> = [
        { name: "swarmgate, LOG_LEVEL=info", env: { LOG_LEVEL: "info" }, modes: [MODES[0]!] },
        {
          name: "swarmgate, no hedge / first-token / idle timers",
          env: {
            SWARMGATE_HEDGE_MS: "0",
            SWARMGATE_FIRST_TOKEN_TIMEOUT_MS: "0",
            SWARMGATE_IDLE_TIMEOUT_MS: "0",
          },
          modes: [MODES[0]!, MODES[2]!],
        },
      ]
      for (const variant of variants) {
        const setup = await startSwarmgate({ SWARMGATE_NODES_FILE: file, ...variant.env })
        const endpoint: Endpoint = {
          target: variant.name,
          url: setup.gateway.baseUrl,
          key: setup.key,
          model: "swarm-prime",
          pid: setup.gateway.child.pid,
        }
        for (const mode of variant.modes)
          ablation.push(
            await measureRow(
              `${mode.name} ${variant.name} c=${sat.c}`,
              endpoint,
              mode.name,
              loadOptions(endpoint, mode, sat.c, sat.duration, sat.warmup),
            ),
          )
        await stopSwarmgate(setup)
      }
    }

    if (sections.has("gc")) {
      log("section gc: what a request leaves to the garbage collector (node --trace-gc-nvp)")
      const traced = await startSwarmgate({ SWARMGATE_NODES_FILE: file }, [
        "--trace-gc-nvp",
        "--import",
        join(REPO_ROOT, "bench/gc-counts.mjs"),
      ])
      const endpoint: Endpoint = {
        target: "swarmgate (GC traced)",
        url: traced.gateway.baseUrl,
        key: traced.key,
        model: "swarm-prime",
        pid: traced.gateway.child.pid,
      }
      const collections = watchCollections(traced.gateway.child)
      pinAll([...allPids().filter((p) => p !== endpoint.pid), endpoint.pid], endpoint.pid)
      // Every mode warmed first, as in the main section: a path first run after others is cold.
      for (const mode of MODES) await run(loadOptions(endpoint, mode, sat.c, seconds(2), 0))
      for (const mode of MODES)
        for (const c of [1, sat.c]) {
          await run(loadOptions(endpoint, mode, c, seconds(1), 0))
          const counted = await observedCollections(traced.gateway.child)
          const before = collections.totals()
          const result = await run(loadOptions(endpoint, mode, c, sat.duration, 0))
          // A moment for the last trace lines to arrive.
          await new Promise((r) => setTimeout(r, 200))
          const after = collections.totals()
          const countedAfter = await observedCollections(traced.gateway.child)
          const observed = countedAfter.young + countedAfter.other - counted.young - counted.other
          const row = gcRow(mode.name, c, result.requests.succeeded, before, after, observed)
          gc.push(row)
          log(
            `gc ${mode.name} c=${c}: ${fmt(row.allocatedKiB, 1)} KiB allocated, ${fmt(row.promotedKiB, 2)} KiB promoted, ${fmt(row.scavengeMicros, 1)} µs in scavenges per request`,
          )
        }
      await stopSwarmgate(traced)
    }

    if (sections.has("profile")) {
      log("section profile")
      const dir = join(RAW, "profile")
      mkdirSync(dir, { recursive: true })
      /** One gateway under `--cpu-prof` through `modes`, each summarised over its own measured window. */
      const profileGateway = async (
        env: Record<string, string>,
        modes: ReadonlyArray<Mode>,
        label: string,
      ) => {
        const profiled = await startSwarmgate(env, ["--cpu-prof", `--cpu-prof-dir=${dir}`])
        const endpoint: Endpoint = {
          target: "swarmgate (profiled)",
          url: profiled.gateway.baseUrl,
          key: profiled.key,
          model: "swarm-prime",
          pid: profiled.gateway.child.pid,
        }
        const windows: Array<{ name: string; window: Measured["windowMicros"]; requests: number }> = []
        for (const mode of modes) {
          const measured = await measure(
            loadOptions(endpoint, mode, sat.c, sat.duration, sat.warmup),
            endpoint.pid,
            allPids().filter((p) => p !== endpoint.pid),
          )
          windows.push({
            name: mode.name,
            window: measured.windowMicros,
            requests: measured.result.requests.succeeded,
          })
        }
        const pid = profiled.gateway.child.pid
        await stopSwarmgate(profiled)
        const mainThread = readdirSync(dir).find((f) => f.includes(`.${pid}.0.`) && f.endsWith(".cpuprofile"))
        if (mainThread === undefined) return log(`no main-thread profile in ${dir}`)
        const profile = readProfile(join(dir, mainThread))
        for (const w of windows) {
          const summary = summarizeProfile(profile, 25, w.window)
          profiles.push({
            case: `${w.name}${label}, 32 connections, ${w.requests} requests`,
            busyMillis: summary.busyMillis,
            requests: w.requests,
            areas: summary.areas.slice(0, 12),
            effectModules: summary.effectModules,
            owners: summary.owners.slice(0, 20),
            functions: summary.functions.slice(0, 20),
          })
        }
      }
      await profileGateway({ SWARMGATE_NODES_FILE: file }, [MODES[0]!, MODES[2]!], "")
      // The scaled-out JSON request too: where its ~3× the embedded request's CPU goes.
      const scaledProfiled = await scaledOut()
      if (scaledProfiled !== undefined) {
        await profileGateway(
          { SWARMGATE_NODES_FILE: file, ...scaledProfiled.env },
          [MODES[0]!],
          ", scaled out",
        )
        await scaledProfiled.cleanup()
      }
    }
    if (sections.has("components")) {
      log("section components")
      const { child, ready } = await startChild({
        name: "components",
        nodeArgs: ["--import", "tsx"],
        script: join(BENCH, "components.ts"),
        args: ["--upstream", instant.url, "--scale", quick ? "0.2" : "0.6"],
        cpus: "1",
        startMillis: 180_000,
        ready: (output) => {
          const line = output.split("\n").find((l) => l.startsWith("[{"))
          return line === undefined ? undefined : (JSON.parse(line) as Array<ComponentCost>)
        },
      })
      components.push(...ready)
      await child.stop(1000)
      // The same programs on Effect 3 (what runs) and Effect 4 (the `effect-4` alias), alternated.
      for (let round = 0; round < 2; round++) {
        for (const pkg of ["effect", "effect-4"]) {
          const run = await startChild({
            name: `effect runtimes (${pkg})`,
            script: join(BENCH, "effect-runtimes.mjs"),
            args: ["--package", pkg, "--scale", quick ? "0.2" : "1"],
            cpus: "1",
            startMillis: 180_000,
            ready: (output) => {
              const line = output.split("\n").find((l) => l.startsWith('{"version"'))
              return line === undefined ? undefined : (JSON.parse(line) as EffectRuntimeRun)
            },
          })
          effectRuntimes.push(run.ready)
          await run.child.stop(1000)
        }
      }
    }
    for (const c of [instant, proxy, proxyFetch]) await stopChild(c.child)
  }

  if (sections.has("streams")) {
    log("section streams")
    const paced = await startScript("paced node", "instant-node.ts", ["--port", "0", "--interval-ms", "50"])
    const proxy = await startScript("bare proxy", "proxy.ts", ["--port", "0", "--upstream", paced.url])
    const swarmgate = await startSwarmgate({ SWARMGATE_NODES_FILE: nodesFile(paced.url, "paced") })
    const endpoints: ReadonlyArray<Endpoint> = [
      { target: "direct", url: paced.url, key: "none", model: "paced", pid: paced.child.pid },
      { target: "bare proxy", url: proxy.url, key: "none", model: "paced", pid: proxy.child.pid },
      {
        target: "swarmgate",
        url: swarmgate.gateway.baseUrl,
        key: swarmgate.key,
        model: "swarm-prime",
        pid: swarmgate.gateway.child.pid,
      },
    ]
    // 40 tokens 50 ms apart: a 2-second stream at 20 tokens/s, like a fast model.
    const mode: Mode = { name: "paced", stream: true, chunks: 40 }
    for (const c of quick ? [10, 500] : [10, 100, 500, 1000, 2000])
      for (const endpoint of endpoints)
        streams.push(
          await measureRow(
            `streams ${c} ${endpoint.target}`,
            endpoint,
            "paced",
            loadOptions(endpoint, mode, c, seconds(6), seconds(3), "undici", { rampMillis: 2000 }),
          ),
        )
    await stopSwarmgate(swarmgate)
    for (const c of [paced, proxy]) await stopChild(c.child)
  }

  if (sections.has("sim")) {
    log("section sim")
    const c = quick ? 200 : 1000
    const swarmgate = await startSwarmgate({ SWARMGATE_SIM_NODES: "250", SWARMGATE_SIM_SPEED: "1000" })
    const endpoint: Endpoint = {
      target: "swarmgate, embedded simulator",
      url: swarmgate.gateway.baseUrl,
      key: swarmgate.key,
      model: "swarm-prime",
      pid: swarmgate.gateway.child.pid,
    }
    sim.push(
      await measureRow(
        `sim ${c} streams`,
        endpoint,
        "sim",
        loadOptions(endpoint, { name: "sim", stream: true, chunks: 0 }, c, seconds(6), seconds(3), "undici", {
          prompt: "How do rivers shape valleys?",
          rampMillis: 1000,
        }),
      ),
    )
    await stopSwarmgate(swarmgate)
  }

  if (sections.has("nodes")) {
    log("section nodes")
    // Every pool size runs at once and is measured once per round, as the main section's targets: the
    // flatness target pairs 1,000 nodes with 10 in each round.
    const pools = []
    for (const n of quick ? [10, 1000] : [10, 100, 300, 1000]) {
      const swarmgate = await startSwarmgate({ SWARMGATE_SIM_NODES: String(n), SWARMGATE_SIM_SPEED: "1000" })
      const pid = swarmgate.gateway.child.pid
      pinAll(allPids(), pid)
      // Longer than one probe interval (5 s), so idle probing shows.
      const idle = await idlePercent(pid, seconds(6))
      const endpoint: Endpoint = {
        target: `swarmgate, ${n} nodes`,
        url: swarmgate.gateway.baseUrl,
        key: swarmgate.key,
        model: "swarm-prime",
        pid,
      }
      pools.push({ n, swarmgate, endpoint, idle, rows: [] as Array<Row> })
    }
    for (let round = 0; round < NODES_ROUNDS; round++)
      for (const { n, endpoint, rows } of pools)
        rows.push(
          await measureRow(
            `nodes ${n} #${round + 1}`,
            endpoint,
            "nodes",
            loadOptions(
              endpoint,
              { name: "nodes", stream: true, chunks: 0 },
              32,
              seconds(4),
              seconds(2),
              "undici",
              {
                prompt: "How do rivers shape valleys?",
                maxTokens: 64,
              },
            ),
          ),
        )
    for (const { n, swarmgate, idle, rows } of pools) {
      nodes.push({
        ...medianBy(rows, (r) => r.cpuMicrosPerRequest),
        ...failuresOf(rows),
        nodes: n,
        idlePercent: idle,
        roundsCpuMicros: rows.map((r) => r.cpuMicrosPerRequest),
      })
      await stopSwarmgate(swarmgate)
    }
  }

  if (sections.has("counts")) {
    log("section counts: per-request Effect steps, fibers, timers, SQL, Redis (bench/counters.mjs)")
    const instant = await startScript("instant node", "instant-node.ts", ["--port", "0"])
    const file = nodesFile(instant.url, "instant")
    const scaled = await scaledOut()
    for (const mode of [
      { name: "embedded", env: {} as Record<string, string> },
      ...(scaled === undefined ? [] : [{ name: "scaled out", env: scaled.env }]),
    ]) {
      for (const stream of [false, true]) {
        const row = await countRequests(mode.name, file, mode.env, stream)
        counts.push(row)
        log(
          `counts ${mode.name} ${stream ? "sse-20" : "json"}: ${fmt(row.ops)} Effect steps, ${fmt(row.fibers, 1)} fibers, ${fmt(row.timers, 1)} timers, ${fmt(row.sql, 2)} SQL, ${fmt(row.redis, 2)} Redis commands per request`,
        )
      }
    }
    await scaled?.cleanup()
    await stopChild(instant.child)
  }

  if (sections.has("instructions")) {
    if (!valgrindAvailable()) log("section instructions: skipped, valgrind (with vgdb) is not installed")
    else {
      log(
        "section instructions: per-request instructions under callgrind, bare proxy vs swarmgate (bench/Instructions.ts)",
      )
      const instant = await startScript("instant node", "instant-node.ts", ["--port", "0"])
      const file = nodesFile(instant.url, "instant")
      for (const mode of [
        { name: "json", stream: false, chunks: 20 },
        { name: "sse-200", stream: true, chunks: 200 },
      ]) {
        for (const c of instructionCases(instant.url, file, mode)) {
          const row = await measureInstructions(c, {
            // Under callgrind V8's compiler threads are still busy after 1,500 requests (~1 M instructions per
            // counted request of graph reduction); after 6,000 "all threads" measures requests.
            warmup: quick ? 1500 : 6000,
            requests: quick ? 200 : 1000,
          })
          instructions.push(row)
          log(
            `instructions ${row.mode} ${row.target}: ${fmt(row.mainPerRequest / 1e6, 2)} M (main thread), ${fmt(row.allPerRequest / 1e6, 2)} M (all threads) per request`,
          )
        }
      }
      await stopChild(instant.child)
    }
  }

  const loadAfter = loadAverage()
  const results = {
    date: new Date().toISOString(),
    revision: revision(),
    command: `npm run bench${process.argv.slice(2).length > 0 ? ` -- ${process.argv.slice(2).join(" ")}` : ""}`,
    machine: machine(),
    load_average: { before: loadBefore, after: loadAfter },
    duration_s: Math.round((Date.now() - started) / 1000),
    main,
    mainRounds,
    crosscheck: cross,
    ablation,
    components,
    effectRuntimes,
    streams,
    sim,
    nodes,
    profiles,
    counts,
    gc,
    instructions,
  }
  const resultsFile = join(OUT, "results.json")
  writeFileSync(resultsFile, `${JSON.stringify(results, null, 2)}\n`)
  // In the repository's own JSON style, so that `biome check` passes on the committed results.
  try {
    execFileSync(join(REPO_ROOT, "node_modules/.bin/biome"), ["format", "--write", resultsFile], {
      stdio: "ignore",
    })
  } catch {
    // Without biome the file is still valid JSON.
  }
  writeFileSync(join(RAW, "raw.json"), JSON.stringify(rawResults.map((r) => ({ id: r.id, ...r.measured }))))
  writeCharts(streams, nodes)
  const markdown = report(results)
  writeFileSync(join(OUT, "results.md"), markdown)
  if (!quick && values.out === undefined) updateBenchmarksMd(markdown)
  log(`done in ${results.duration_s} s; results in ${OUT}, raw results in ${RAW}`)
}

const writeCharts = (streams: ReadonlyArray<Row>, nodes: ReadonlyArray<NodesRow>, dir: string = OUT) => {
  const byTarget = (rows: ReadonlyArray<Row>, target: string, pick: (r: Row) => number) =>
    rows.filter((r) => r.target === target).map((r) => [r.concurrency, pick(r)] as const)
  if (streams.length > 0) {
    writeFileSync(
      join(dir, "streams-cpu-per-token.svg"),
      lineSvg({
        title: "CPU per streamed token vs concurrent streams",
        xLabel: "concurrent streams (20 tokens/s each)",
        yLabel: "CPU µs per token (process under test)",
        logX: true,
        logY: true,
        series: ["swarmgate", "bare proxy", "direct"].map((t) => ({
          name: t,
          points: byTarget(streams, t, (r) => r.cpuMicrosPerChunk),
        })),
      }),
    )
    writeFileSync(
      join(dir, "streams-itl.svg"),
      lineSvg({
        title: "Inter-token latency vs concurrent streams (node sends every 50 ms)",
        xLabel: "concurrent streams",
        yLabel: "ITL ms",
        logX: true,
        logY: true,
        series: ["swarmgate", "bare proxy", "direct"].flatMap((t) => [
          { name: `${t} p50`, points: byTarget(streams, t, (r) => r.itlP50 / 1000) },
          { name: `${t} p99`, points: byTarget(streams, t, (r) => r.itlP99 / 1000), dashed: true },
        ]),
      }),
    )
    writeFileSync(
      join(dir, "streams-rss.svg"),
      lineSvg({
        title: "Resident memory vs concurrent streams",
        xLabel: "concurrent streams",
        yLabel: "RSS MiB",
        logX: true,
        references: [{ label: "target 300 MB", value: 300 / 1.048576 }],
        series: ["swarmgate", "bare proxy", "direct"].map((t) => ({
          name: t,
          points: byTarget(streams, t, (r) => r.rssMiB),
        })),
      }),
    )
    writeFileSync(
      join(dir, "streams-throughput.svg"),
      lineSvg({
        title: "Delivered tokens/s vs concurrent streams (offered: 20 per stream)",
        xLabel: "concurrent streams",
        yLabel: "tokens/s",
        logX: true,
        logY: true,
        series: [
          { name: "offered", points: byTarget(streams, "direct", (r) => r.concurrency * 20), dashed: true },
          ...["swarmgate", "bare proxy", "direct"].map((t) => ({
            name: t,
            points: byTarget(streams, t, (r) => r.chunksPerSecond),
          })),
        ],
      }),
    )
  }
  if (nodes.length > 0)
    writeFileSync(
      join(dir, "nodes-cpu.svg"),
      lineSvg({
        title: "Cost vs number of embedded simulated nodes (32 streams)",
        xLabel: "simulated nodes",
        yLabel: "CPU µs per token / idle CPU %",
        logX: true,
        series: [
          { name: "CPU µs per token", points: nodes.map((r) => [r.nodes, r.cpuMicrosPerChunk] as const) },
          {
            name: "idle CPU % (no traffic)",
            points: nodes.map((r) => [r.nodes, r.idlePercent] as const),
            dashed: true,
          },
        ],
      }),
    )
}

const targets = (
  main: ReadonlyArray<Row>,
  streams: ReadonlyArray<Row>,
  sim: ReadonlyArray<Row>,
  nodes: ReadonlyArray<NodesRow>,
  counts: ReadonlyArray<CountRow>,
  rounds: ReadonlyArray<RoundRow> = [],
): Array<Target> => {
  const get = (mode: string, target: string) => main.find((r) => r.mode === mode && r.target === target)
  /**
   * `of` of `a` against `b` (rows of one mode) in each round where both ran,
   * each at its row's connections: measured seconds apart, so a slower or
   * busier host weighs on both sides of each pair. Fewer than two without
   * rounds.
   */
  const paired = (a: Row, b: Row, of: (a: Row, b: Row) => number): Array<number> => {
    const at = (row: Row) =>
      rounds.filter(
        (r) => r.mode === row.mode && r.target === row.target && r.concurrency === row.concurrency,
      )
    const bs = at(b)
    return at(a).flatMap((x) => {
      const y = bs.find((r) => r.round === x.round)
      return y === undefined ? [] : [of(x, y)]
    })
  }
  /** The median; of an even count, the mean of the middle two; NaN when a round measured nothing. */
  const middle = (values: ReadonlyArray<number>) => {
    if (values.some(Number.isNaN)) return Number.NaN
    const sorted = [...values].sort((x, y) => x - y)
    const half = Math.floor(sorted.length / 2)
    return sorted.length % 2 === 1 ? sorted[half]! : (sorted[half - 1]! + sorted[half]!) / 2
  }
  /** The rows' value, or with rounds the median of the paired rounds' (and the rounds, for the table). */
  const pairedValue = (a: Row, b: Row, of: (a: Row, b: Row) => number, digits: number, unit: string) => {
    const values = paired(a, b, of)
    if (values.length < 2) return { value: of(a, b), rounds: "" }
    return {
      value: middle(values),
      rounds: `the median of the rounds' ${values.map((v) => `${fmt(v, digits)}${unit}`).join(" / ")}`,
    }
  }
  /** The one-connection rounds of `row`'s target (latency), as rows of that concurrency. */
  const single = (row: Row): Row => ({ ...row, concurrency: 1 })
  const out: Array<Target> = []
  /**
   * The issue's goal is requests/s *per core*. The bare proxy uses only
   * 51–75 % of its core in the bench (waking processes on two vCPUs bounds
   * it), so its req/s understate what its core serves and a ratio of req/s
   * would read high; the req/s ratio is shown beside.
   */
  const throughput = (goal: string, g: Row, p: Row, times: number) => {
    const digits = times < 1 ? 3 : 2
    const { value: r, rounds } = pairedValue(
      g,
      p,
      (x, y) => requestsPerCore(x) / requestsPerCore(y),
      digits,
      "×",
    )
    const rows = `${fmt(requestsPerCore(g))} vs ${fmt(requestsPerCore(p))} req/s per core; in req/s ${fmt(g.rps / p.rps, digits)}×, ${fmt(g.rps)} vs ${fmt(p.rps)}`
    return {
      target: goal,
      measured: `${fmt(r, digits)}× per core (${rounds === "" ? rows : `${rounds}; the median rows ${rows}`})`,
      met: r >= times,
    }
  }
  /** Added latency in ms: `g`'s percentile `of` minus the direct node's `d`, at one connection. */
  const addedMillis = (goal: string, g: Row, d: Row, of: (r: Row) => number, limit: number) => {
    const { value, rounds } = pairedValue(single(g), single(d), (x, y) => (of(x) - of(y)) / 1000, 3, " ms")
    return {
      target: goal,
      measured: `${fmt(value, 3)} ms${rounds === "" ? "" : ` (${rounds})`}`,
      met: value <= limit,
    }
  }
  const gw = get("json", "swarmgate")
  const px = get("json", "bare proxy")
  const dj = get("json", "direct")
  if (gw !== undefined && px !== undefined && dj !== undefined) {
    out.push(throughput("JSON throughput ≥ 0.5 × bare proxy (per core)", gw, px, 0.5))
    out.push(addedMillis("added latency p50 ≤ 0.3 ms (1 connection)", gw, dj, (r) => r.e2eP50, 0.3))
    out.push(addedMillis("added latency p99 ≤ 1 ms (1 connection)", gw, dj, (r) => r.e2eP99, 1))
  }
  for (const mode of ["sse-20", "sse-200"]) {
    const g = get(mode, "swarmgate")
    const p = get(mode, "bare proxy")
    if (g === undefined || p === undefined) continue
    out.push(throughput(`${mode.toUpperCase()} throughput ≥ 0.5 × bare proxy (per core)`, g, p, 0.5))
  }
  // The same goal for the scaled-out mode, reported beside the embedded one (its CPU is the gateway's own:
  // PostgreSQL's and Redis's are not in it).
  for (const mode of ["json", "sse-20", "sse-200"]) {
    const g = get(mode, SCALED_OUT)
    const p = get(mode, "bare proxy")
    if (g === undefined || p === undefined) continue
    out.push(
      throughput(
        `scaled out: ${mode === "json" ? "JSON" : mode.toUpperCase()} throughput ≥ 0.5 × bare proxy (per core)`,
        g,
        p,
        0.5,
      ),
    )
  }
  const few = nodes.find((n) => n.nodes === 10)
  const many = nodes.find((n) => n.nodes === 1000)
  if (few !== undefined && many !== undefined) {
    // With rounds, the median of each round's 1,000 against its 10 (measured seconds apart).
    const ratios = (many.roundsCpuMicros ?? []).flatMap((m, i) => {
      const f = few.roundsCpuMicros?.[i]
      return f === undefined ? [] : [m / f]
    })
    const r = ratios.length >= 2 ? middle(ratios) : many.cpuMicrosPerRequest / few.cpuMicrosPerRequest
    out.push({
      target: "CPU per request flat from 10 to 1,000 nodes (≤ 1.25×)",
      measured: `${fmt(r, 2)}× (${ratios.length >= 2 ? `the median of the rounds' ${ratios.map((x) => `${fmt(x, 2)}×`).join(" / ")}; the median rows ` : ""}${fmt(few.cpuMicrosPerRequest)} → ${fmt(many.cpuMicrosPerRequest)} µs)`,
      met: r <= 1.25,
    })
  }
  for (const c of counts.filter((c) => c.mode === "scaled out"))
    out.push({
      target: `scaled out: ≤ 2 Redis round trips per request (${c.stream ? "SSE" : "JSON"})`,
      measured: `${fmt(c.requestPathTrips, 2)} round trips on the request path, ${fmt(c.redisTrips - c.requestPathTrips, 2)} behind it (ledger writer, batch renewals); ${fmt(c.redis, 2)} commands per request`,
      // None found would mean the script names no longer match, not zero round trips.
      met: c.requestPathTrips > 0 && c.requestPathTrips <= 2,
    })
  for (const mode of ["json", "sse-20", "sse-200"]) {
    const g = get(mode, "swarmgate")
    const p = get(mode, "Portkey")
    if (g === undefined || p === undefined || !(p.cpuMicrosPerRequest > 0)) continue
    out.push(throughput(`${mode.toUpperCase()} throughput ≥ 8 × Portkey OSS (per core)`, g, p, 8))
  }
  const gs = get("sse-20", "swarmgate")
  const ds = get("sse-20", "direct")
  if (gs !== undefined && ds !== undefined)
    out.push(addedMillis("added TTFT p50 ≤ 1 ms (SSE, 1 connection)", gs, ds, (r) => r.ttftP50, 1))
  const g10 = streams.find((r) => r.target === "swarmgate" && r.concurrency === 10)
  const d10 = streams.find((r) => r.target === "direct" && r.concurrency === 10)
  if (g10 !== undefined && d10 !== undefined) {
    const o = (g10.itlP50 - d10.itlP50) / 1000
    out.push({
      target: "inter-token overhead p50 ≤ 0.1 ms (10 paced streams)",
      measured: `${fmt(o, 3)} ms`,
      met: o <= 0.1,
    })
  }
  const s = sim[0]
  if (s !== undefined) {
    const perCore = s.chunksPerSecond / Math.max(0.01, s.cpuPercent / 100)
    out.push({
      target: `≥ 100,000 streamed tokens/s per core, ≥ 1,000 streams, embedded simulator`,
      measured: `${fmt(perCore)} tokens/s per core (${fmt(s.chunksPerSecond)} tokens/s at ${fmt(s.cpuPercent)}% CPU, ${s.concurrency} streams)`,
      met: s.concurrency >= 1000 ? perCore >= 100_000 : undefined,
    })
  }
  const g2000 = streams.find((r) => r.target === "swarmgate" && r.concurrency === 2000)
  if (g2000 !== undefined)
    out.push({
      target: "RSS ≤ 300 MB with 2,000 open streams",
      measured: `${fmt(g2000.rssMiB * 1.048576)} MB (peak ${fmt(g2000.hwmMiB * 1.048576)} MB)`,
      met: g2000.rssMiB * 1.048576 <= 300,
    })
  return out
}

/** The commit, and how many files differ from it: other engineers work in this tree while it runs. */
const revision = () => {
  try {
    const git = (...args: Array<string>) =>
      execFileSync("git", args, { cwd: REPO_ROOT, encoding: "utf8" }).trim()
    const changed = git("status", "--porcelain")
      .split("\n")
      .filter((l) => l.length > 0).length
    return `${git("rev-parse", "--short", "HEAD")}${changed > 0 ? ` + ${changed} uncommitted files` : ""}`
  } catch {
    return "unknown"
  }
}

interface Results {
  readonly date: string
  readonly revision: string
  readonly command: string
  readonly machine: ReturnType<typeof machine>
  readonly load_average: { readonly before: ReadonlyArray<number>; readonly after: ReadonlyArray<number> }
  readonly duration_s: number
  readonly main: ReadonlyArray<Row>
  /** Every round of the main section (loaded and one-connection), from which `main` took the medians. */
  readonly mainRounds?: ReadonlyArray<RoundRow> | undefined
  readonly crosscheck: ReadonlyArray<CrossCheck>
  readonly ablation: ReadonlyArray<Row>
  readonly components: ReadonlyArray<ComponentCost>
  readonly effectRuntimes?: ReadonlyArray<EffectRuntimeRun> | undefined
  readonly streams: ReadonlyArray<Row>
  readonly sim: ReadonlyArray<Row>
  readonly nodes: ReadonlyArray<NodesRow>
  readonly profiles: ReadonlyArray<ProfileResult>
  readonly counts: ReadonlyArray<CountRow>
  readonly gc?: ReadonlyArray<GcRow> | undefined
  readonly instructions: ReadonlyArray<InstructionsRow>
}

/** What one request costs inside the gateway, counted by bench/counters.mjs over sequential requests. */
interface CountRow {
  readonly mode: string
  readonly stream: boolean
  readonly requests: number
  readonly ops: number
  readonly fibers: number
  readonly timers: number
  readonly sql: number
  readonly redis: number
  /** Socket writes to Redis per request: round trips (a pipeline is one). */
  readonly redisTrips: number
  /** Redis commands per request by name. */
  readonly redisByName: Readonly<Record<string, number>>
  /** Round trips per request by what they carry (scripts by name, or commands). */
  readonly redisTripsBy: Readonly<Record<string, number>>
  /** Round trips that carry a request's own scripts (admission, hold, release, settlement, their renewals). */
  readonly requestPathTrips: number
  readonly gc: number
  readonly gcMicros: number
  readonly cpuMicros: number
}

const COUNTED = 400

/** The scripts one request runs itself; everything else (the ledger writer, batch renewals) runs behind. */
const REQUEST_PATH_SCRIPTS = new Set([
  "quota.admit",
  "quota.poll",
  "quota.commit",
  "quota.release",
  "quota.renew",
  "billing.reserve",
  "billing.settle",
  "billing.voidHold",
])

/** SHA → `package.script` of every Lua script, so that the counters can name what each round trip carries. */
const redisScriptNames = async (): Promise<Record<string, string>> => {
  const names: Record<string, string> = {}
  for (const [pkg, file] of [
    ["quota", "packages/quota/src/internal/Scripts.ts"],
    ["billing", "packages/billing/src/internal/RedisScripts.ts"],
  ] as const) {
    const module: Record<string, unknown> = await import(join(REPO_ROOT, file))
    for (const [name, value] of Object.entries(module)) {
      const sha = (value as { sha?: unknown } | null)?.sha
      if (typeof sha === "string") names[sha] = `${pkg}.${name}`
    }
  }
  return names
}

/** PostgreSQL and Redis for the scaled-out mode: a database made for this run, a key prefix of its own. */
const scaledOut = async () => {
  const base = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test"
  const redis = process.env.TEST_REDIS_URL ?? "redis://127.0.0.1:6379"
  const name = `bench_${process.pid}`
  try {
    const { default: pg } = await import("pg")
    const admin = new pg.Client({ connectionString: base })
    await admin.connect()
    await admin.query(`CREATE DATABASE ${name}`)
    await admin.end()
    const url = new URL(base)
    url.pathname = `/${name}`
    return {
      env: {
        DATABASE_URL: url.toString(),
        REDIS_URL: redis,
        SWARMGATE_REDIS_PREFIX: `swarmgate-bench-${process.pid}:`,
      },
      cleanup: async () => {
        const admin = new pg.Client({ connectionString: base })
        await admin.connect()
        await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
        await admin.end()
        const { Redis } = await import("ioredis")
        const client = new Redis(redis)
        const keys = await client.keys(`swarmgate-bench-${process.pid}:*`)
        if (keys.length > 0) await client.del(...keys)
        client.disconnect()
      },
    }
  } catch (error) {
    log(`scaled-out mode skipped: PostgreSQL or Redis not reachable (${String(error).slice(0, 120)})`)
    return undefined
  }
}

/** The bare proxy and swarmgate (its bundle, as `npm start` runs it) against the instant node, under callgrind. */
const instructionCases = (
  upstream: string,
  nodes: string,
  mode: { readonly name: string; readonly stream: boolean; readonly chunks: number },
): ReadonlyArray<InstructionsCase> => {
  const adminToken = randomBytes(16).toString("hex")
  // Beside the nodes file: removed with it when the bench ends.
  const dir = dirname(nodes)
  return [
    {
      target: "bare proxy",
      mode: mode.name,
      argv: ["--import", "tsx", join(BENCH, "proxy.ts"), "--port", "0", "--upstream", upstream],
      env: {},
      model: "instant",
      ...mode,
    },
    {
      target: "swarmgate",
      mode: mode.name,
      argv: [join(REPO_ROOT, "apps/server/dist/main.js"), "serve"],
      env: {
        PORT: "0",
        DATABASE_URL: `sqlite:${join(dir, `${mode.name}.db`)}`,
        SWARMGATE_ADMIN_TOKEN: adminToken,
        LOG_LEVEL: "warn",
        SWARMGATE_NODES_FILE: nodes,
        SWARMGATE_MAX_IN_FLIGHT: "8192",
        SWARMGATE_PRESETS: JSON.stringify({ "swarm-prime": { strategy: "single" } }),
      },
      setup: (baseUrl) =>
        createLoadKey({
          admin: async <T>(method: string, path: string, body?: unknown) => {
            const response = await fetch(`${baseUrl}/admin/v1${path}`, {
              method,
              headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
              body: JSON.stringify(body),
            })
            return { status: response.status, body: (await response.json()) as T }
          },
        }).then(({ key }) => key),
      model: "swarm-prime",
      ...mode,
    },
  ]
}

const countRequests = async (
  mode: string,
  nodes: string,
  env: Record<string, string>,
  stream: boolean,
): Promise<CountRow> => {
  // The sources under tsx, so that the counters see the same effect, pg and ioredis modules the gateway uses.
  const gateway = await startGateway({
    script: join(REPO_ROOT, "apps/server/src/main.ts"),
    nodeArgs: ["--import", "tsx", "--import", join(BENCH, "counters.mjs")],
    cpus: String(CORE_GENERATOR),
    env: {
      SWARMGATE_NODES_FILE: nodes,
      LOG_LEVEL: "warn",
      SWARMGATE_PRESETS: JSON.stringify({ "swarm-prime": { strategy: "single" } }),
      BENCH_REDIS_SCRIPTS: JSON.stringify(await redisScriptNames()),
      ...env,
    },
  })
  try {
    await waitReady(gateway.baseUrl)
    const { key } = await createLoadKey(gateway)
    const body = JSON.stringify({
      model: "swarm-prime",
      stream,
      max_tokens: 256,
      messages: [{ role: "user", content: "Say the word the, over and over. chunks=20" }],
    })
    const once = async () => {
      const response = await fetch(`${gateway.baseUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body,
      })
      await response.text()
      if (response.status !== 200) throw new Error(`counts: status ${response.status}`)
    }
    const pid = gateway.child.pid
    const snapshot = async () => {
      const before = gateway.child.output().length
      process.kill(pid, "SIGUSR2")
      for (let i = 0; i < 100; i++) {
        const line = gateway.child
          .output()
          .slice(before)
          .split("\n")
          .find((l) => l.startsWith("BENCH-COUNTS "))
        if (line !== undefined)
          return JSON.parse(line.slice("BENCH-COUNTS ".length)) as Record<string, number> & {
            readonly redisByName?: Record<string, number>
            readonly redisWritesBy?: Record<string, number>
          }
        await new Promise((r) => setTimeout(r, 20))
      }
      throw new Error("counts: no answer from the counters")
    }
    for (let i = 0; i < 200; i++) await once()
    await new Promise((r) => setTimeout(r, 200))
    await snapshot()
    const cpuBefore = cpuMicrosOf(pid)
    for (let i = 0; i < COUNTED; i++) await once()
    // Settled, logged and written behind: the ledger's batch lands within its 50 ms window.
    await new Promise((r) => setTimeout(r, 300))
    const cpu = cpuMicrosOf(pid) - cpuBefore
    const c = await snapshot()
    const per = (n: number | undefined) => (n ?? 0) / COUNTED
    const perName = (byName: Record<string, number> | undefined) =>
      Object.fromEntries(
        Object.entries(byName ?? {})
          .map(([name, n]) => [name, Math.round((n / COUNTED) * 100) / 100] as const)
          .sort((a, b) => b[1] - a[1]),
      )
    return {
      mode,
      stream,
      requests: COUNTED,
      ops: per(c.ops),
      fibers: per(c.fibers),
      timers: per(c.timers),
      sql: per(c.sql),
      redis: per(c.redis),
      redisTrips: per(c.redisWrites),
      redisByName: perName(c.redisByName),
      redisTripsBy: perName(c.redisWritesBy),
      requestPathTrips: per(
        Object.entries(c.redisWritesBy ?? {})
          .filter(([what]) => what.split(" + ").some((name) => REQUEST_PATH_SCRIPTS.has(name)))
          .reduce((sum, [, n]) => sum + n, 0),
      ),
      gc: per(c.gc),
      gcMicros: per((c.gcMillis ?? 0) * 1000),
      cpuMicros: cpu / COUNTED,
    }
  } finally {
    await gateway.stop()
  }
}

const countsTable = (rows: ReadonlyArray<CountRow>) =>
  [
    "| mode | request | Effect steps | fibers | timers | SQL statements | Redis commands | Redis round trips | GCs | GC µs | CPU µs (1 connection) |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map(
      (r) =>
        `| ${r.mode} | ${r.stream ? "SSE, 20 chunks" : "JSON"} | ${fmt(r.ops)} | ${fmt(r.fibers, 1)} | ${fmt(r.timers, 1)} | ${fmt(r.sql, 2)} | ${fmt(r.redis, 2)} | ${fmt(r.redisTrips, 2)} | ${fmt(r.gc, 3)} | ${fmt(r.gcMicros)} | ${fmt(r.cpuMicros)} |`,
    ),
    "",
    ...rows
      .filter((r) => r.redis > 0)
      .map(
        (r) =>
          `Redis commands per request, ${r.mode} ${r.stream ? "SSE" : "JSON"}: ${Object.entries(r.redisByName)
            .map(([name, n]) => `${name} ${n}`)
            .join(", ")}. Round trips by what they carry: ${Object.entries(r.redisTripsBy)
            .map(([what, n]) => `${what} ${n}`)
            .join("; ")}.`,
      ),
  ].join("\n")

interface ComponentCost {
  readonly name: string
  readonly unit: string
  readonly cpuMicros: number
}

/** One process of `bench/effect-runtimes.mjs`: an Effect version and its costs. */
interface EffectRuntimeRun {
  readonly version: string
  readonly results: ReadonlyArray<ComponentCost>
}

/** Effect 3 against Effect 4, each cell the lower of its runs (the runs alternate). */
const effectRuntimesTable = (runs: ReadonlyArray<EffectRuntimeRun>): string => {
  const versions = [...new Set(runs.map((r) => r.version))]
  const names = runs[0]?.results ?? []
  const best = (version: string, name: string) =>
    Math.min(
      ...runs
        .filter((r) => r.version === version)
        .flatMap((r) => r.results.filter((c) => c.name === name).map((c) => c.cpuMicros)),
    )
  const [v3, v4] = versions
  return [
    `| program | unit | ${versions.map((v) => `Effect ${v}, CPU µs`).join(" | ")} | ${v3 !== undefined && v4 !== undefined ? `${v3} ÷ ${v4}` : "ratio"} |`,
    `|---|---|${versions.map(() => "---:|").join("")}---:|`,
    ...names.map((c) => {
      const cells = versions.map((v) => best(v, c.name))
      const ratio = cells.length === 2 && cells[1]! > 0 ? `${fmt(cells[0]! / cells[1]!, 1)}×` : "–"
      return `| ${c.name} | ${c.unit} | ${cells.map((x) => fmt(x, 3)).join(" | ")} | ${ratio} |`
    }),
  ].join("\n")
}

interface ProfileResult {
  readonly case: string
  readonly busyMillis: number
  readonly requests: number
  readonly areas: ReadonlyArray<ProfileEntry>
  readonly effectModules: ReadonlyArray<ProfileEntry>
  readonly owners: ReadonlyArray<ProfileEntry>
  readonly functions: ReadonlyArray<ProfileEntry>
}

const report = (r: Results): string => {
  const m = r.machine
  const parts = [
    `Run ${r.date} (tree ${r.revision}) with \`${r.command}\` in ${r.duration_s} s on ${m.nproc} × ${m.cpuModel}, ${m.memoryGiB} GiB, Node ${m.node}, Linux ${m.kernel}; load average ${r.load_average.before.join(" / ")} before, ${r.load_average.after.join(" / ")} after (1/5/15 min).`,
  ]
  const t = targets(r.main, r.streams, r.sim, r.nodes, r.counts, r.mainRounds)
  if (t.length > 0) parts.push("### Targets\n", targetsTable(t))
  if (r.main.length > 0)
    parts.push(
      "### Throughput and cost (32 connections, closed loop)\n",
      "Portkey OSS 1.15.2 is compared on JSON only: on this Node 20 it fails every streamed request (`TypeError: immutable` when it appends to a fetch Response's headers).\n",
      "CPU is the process under test's own user + system time over the measured window (`/proc/<pid>/stat`) divided by the successful requests; RSS at the end of the run. Where the run had rounds, each row is its target's round of median CPU per request, its errors those of every round. ⚠ = another tenant of the machine held more than 20% of core 1 during the run: its req/s is low, its CPU µs/req still holds.\n",
      throughputTable(r.main),
      "### Latency at one connection (µs)\n",
      "`added` = this target's percentile minus the direct node's percentile; `× proxy` = swarmgate's added latency over the bare proxy's. Where the run had rounds, each row is its target's round of median p99 (the targets table pairs each round with the direct node's instead).\n",
      latencyTable(r.main),
    )
  if (r.counts.length > 0)
    parts.push(
      "### What one request costs inside the gateway (counted, per request)\n",
      `${COUNTED} sequential requests after 200 of warm-up, against the instant node, counted inside the gateway process by \`bench/counters.mjs\` (a preload that wraps Effect's run-loop handlers and fiber start, timers, better-sqlite3 / pg statements and ioredis commands at run time); the gateway runs from its sources under tsx here so the counters see its modules. Scaled out = PostgreSQL + Redis (\`DATABASE_URL\`, \`REDIS_URL\`). SQL statements are the ledger's batched writes, per request.\n`,
      countsTable(r.counts),
    )
  if (r.gc !== undefined && r.gc.length > 0)
    parts.push(
      "### What a request leaves to the garbage collector (per request)\n",
      "The compiled gateway (as `npm start` runs it) under `node --trace-gc-nvp`, against the instant node, each mode warmed first; the collections V8 reports while the load ran, divided by its successful requests. *Promoted* is what survived young collections and moved to the old generation: a request that lives a few milliseconds should leave almost nothing there, and what it does leave is copied, then marked and compacted later. Pauses are the main thread's. The last column compares the collections the trace showed with those the process counted itself (`bench/gc-counts.mjs`): V8 writes the trace to a pipe that drops lines when full, and a row marked ⚠ reads low.\n",
      gcTable(r.gc),
    )
  if (r.instructions.length > 0)
    parts.push(
      "### Instructions per request (callgrind: not moved by other tenants)\n",
      "Counted by valgrind's callgrind in the process under test, switched on after a warm-up for a fixed number of requests (8 at a time) against the instant node (`bench/Instructions.ts`). The main thread is the request's own work; all threads adds V8's concurrent GC and compilers. Repeated runs of one build spread up to ~5 % on the main thread (how many requests a turn of the event loop serves, and when V8's compiler threads finish, move with timing): a change of a few per cent needs several runs of each build. User space only: the kernel's socket work, most of what a bare proxy costs, is not counted, so these compare builds of swarmgate rather than swarmgate to the proxy.\n",
      instructionsTable(r.instructions),
    )
  if (r.ablation.length > 0) {
    const base = (mode: string) => r.main.find((m) => m.mode === mode && m.target === "swarmgate")
    parts.push(
      "### Ablation: swarmgate with parts switched off by configuration (32 connections)\n",
      ablationTable(r.ablation, base),
    )
  }
  if (r.components.length > 0)
    parts.push(
      "### Component costs, measured alone on core 1 (CPU µs per unit; `bench/components.ts`)\n",
      [
        "| component | unit | CPU µs |",
        "|---|---|---:|",
        ...r.components.map((c) => `| ${c.name} | ${c.unit} | ${fmt(c.cpuMicros, 1)} |`),
      ].join("\n"),
    )
  if (r.effectRuntimes !== undefined && r.effectRuntimes.length > 0)
    parts.push(
      "### Effect 3 and Effect 4 on the same programs (CPU µs per unit, core 1; `bench/effect-runtimes.mjs`)\n",
      "The gateway runs Effect 3; Effect 4 is installed under the alias `effect-4` for this table only. Not the gateway's own path (it is written against Effect 3's API), but the primitives it is made of.\n",
      effectRuntimesTable(r.effectRuntimes),
    )
  if (r.crosscheck.length > 0)
    parts.push(
      "### Generator cross-check (JSON; our load generator vs autocannon)\n",
      "Each cell is the median of 3 alternated runs; (±%) = autocannon against our generator (undici client), the one every other table uses. autocannon's req/s is its completed responses over its run, its p50 from its own per-request timer; its non-2xx must be 0, or its request differed from ours. Where autocannon is much faster, our generator, not the target, limits that row.\n",
      crossCheckTable(r.crosscheck),
    )
  if (r.streams.length > 0)
    parts.push(
      "### Concurrent streams (paced node: 40 tokens, one per 50 ms)\n",
      streamsTable(r.streams),
      "\n![CPU per token](bench/results/streams-cpu-per-token.svg)\n![Throughput](bench/results/streams-throughput.svg)\n![ITL](bench/results/streams-itl.svg)\n![RSS](bench/results/streams-rss.svg)",
    )
  if (r.sim.length > 0)
    parts.push(
      "### Embedded simulator (SWARMGATE_SIM_NODES=250, SWARMGATE_SIM_SPEED=1000)\n",
      streamsTable(r.sim),
    )
  if (r.nodes.length > 0)
    parts.push(
      "### Number of nodes (embedded simulator, SWARMGATE_SIM_SPEED=1000, 32 streams of ≤ 64 tokens)\n",
      ...(r.nodes.some((n) => (n.roundsCpuMicros?.length ?? 0) >= 2)
        ? [
            "Every pool size runs at once, each measured once per round; each row is its round of median CPU per request (every round's in results.json), and the targets table pairs 1,000 nodes with 10 round by round.\n",
          ]
        : []),
      nodesTable(r.nodes),
      "\n![Nodes](bench/results/nodes-cpu.svg)",
    )
  for (const p of r.profiles)
    parts.push(
      `### CPU profile of the gateway: ${p.case} (${fmt(p.busyMillis)} ms busy, ${fmt((p.busyMillis * 1000) / Math.max(1, p.requests))} µs per request)\n`,
      "Self time by where the code lives:\n",
      profileTable(p.areas, false),
      "\nEffect's self time by module:\n",
      profileTable(p.effectModules, false),
      '\nEach sample charged to the innermost swarmgate function on its stack ("no swarmgate frame": the runtime between program steps, GC, I/O):\n',
      profileTable(p.owners, false),
      "\nTop functions by self time:\n",
      profileTable(p.functions, true),
    )
  return `${parts.join("\n\n")}\n`
}

const BEGIN = "<!-- bench:begin (written by npm run bench) -->"
const END = "<!-- bench:end -->"

const updateBenchmarksMd = (markdown: string) => {
  const path = join(REPO_ROOT, "BENCHMARKS.md")
  let text: string
  try {
    text = readFileSync(path, "utf8")
  } catch {
    text = `# Benchmarks\n\n${BEGIN}\n${END}\n`
  }
  const start = text.indexOf(BEGIN)
  const end = text.indexOf(END)
  if (start < 0 || end < start) text = `${text}\n${BEGIN}\n${END}\n`
  const from = text.indexOf(BEGIN) + BEGIN.length
  writeFileSync(path, `${text.slice(0, from)}\n${markdown}${text.slice(text.indexOf(END))}`)
}

const cleanup = async () => {
  await Promise.all([...gateways.map((g) => g.stop()), ...children.map((c) => c.stop(3000))])
  rmSync(join(tmpdir(), `swarmgate-bench-${process.pid}`), { recursive: true, force: true })
}

process.once("SIGINT", () => {
  void cleanup().then(() => process.exit(130))
})

/** The report of a recorded run, as this code renders it (e.g. after a change of how a target is read). */
const rerender = async (given: string) => {
  const file = resolve(given)
  const results = JSON.parse(readFileSync(file, "utf8")) as Results
  const dir = dirname(file)
  const markdown = report(results)
  writeFileSync(join(dir, "results.md"), markdown)
  writeCharts(results.streams, results.nodes, dir)
  if (dir === join(REPO_ROOT, "bench/results")) updateBenchmarksMd(markdown)
  log(`rendered ${file} again into ${join(dir, "results.md")}`)
}

;(values.rerender !== undefined ? rerender(values.rerender) : main())
  .then(cleanup)
  .catch(async (error: unknown) => {
    console.error(error)
    await cleanup()
    process.exit(1)
  })
