/**
 * Command-line flags of `loadtest`: durations (`500ms`, `30s`, `2m`), the
 * goodput SLO (`ttft:500,tpot:50,e2el:2000`, milliseconds, as vLLM's
 * benchmark writes it) and the spawn setup.
 */
import { parseArgs } from "node:util"

export type ClientKind = "undici" | "http"

export interface Slo {
  readonly ttftMillis?: number | undefined
  readonly tpotMillis?: number | undefined
  readonly e2elMillis?: number | undefined
}

export interface SpawnOptions {
  /** node-sim processes; 0 = the gateway's embedded simulated swarm. */
  readonly nodeSims: number
  readonly nodesPerSim: number
  readonly nodeSimArgs: ReadonlyArray<string>
  readonly env: Readonly<Record<string, string>>
  /** `taskset -c` list for every spawned process (unset = no pinning). */
  readonly cpus: string | undefined
}

export interface LoadOptions {
  readonly url: string
  readonly key: string
  readonly model: string
  readonly stream: boolean
  readonly maxTokens: number | undefined
  readonly prompt: string
  readonly extra: Readonly<Record<string, unknown>>
  /** More request headers; not settable from the command line (the bench uses it for a peer gateway). */
  readonly headers?: Readonly<Record<string, string>> | undefined
  readonly concurrency: number
  /** Requests per second of the open loop (Poisson arrivals); unset = closed loop. */
  readonly rate: number | undefined
  readonly durationMillis: number
  readonly warmupMillis: number
  /** Closed loop: the N workers start evenly spread over this time, so long streams do not move in lockstep. */
  readonly rampMillis?: number | undefined
  readonly timeoutMillis: number
  readonly client: ClientKind
  readonly slo: Slo | undefined
  readonly seed: number
}

export interface CliOptions extends LoadOptions {
  readonly spawn: SpawnOptions | undefined
  readonly jsonPath: string | undefined
  readonly htmlPath: string | undefined
  readonly outDir: string | undefined
  readonly progress: boolean
  readonly quiet: boolean
  readonly label: string | undefined
}

export const usage = `Usage: loadtest [options]     load test of an OpenAI-compatible chat-completions endpoint

  --url URL              base URL (…/v1/chat/completions is appended unless present)
  --key KEY              bearer key (default: $SWARMGATE_KEY, then $OPENAI_API_KEY)
  --model NAME           model (default swarm-prime)
  --concurrency N        closed loop: N requests in flight (default 8); with --rate: at most N in flight
  --rate R               open loop: Poisson arrivals at R requests/s (latency counts from the arrival)
  --duration D           measured time, e.g. 500ms, 30s, 2m (default 30s)
  --warmup D             traffic before the measurement, not counted (default 0s)
  --ramp D               closed loop: start the N requests spread evenly over D (default 0s)
  --stream               SSE (stream_options.include_usage) instead of one JSON body
  --max-tokens N         max_tokens of every request (default 128; 0 = not sent)
  --prompt TEXT          the user message (default a short question)
  --extra JSON           more request fields, merged into the body
  --timeout D            per request (default 60s)
  --goodput SLO          e.g. ttft:500,tpot:50,e2el:2000 (ms): goodput = requests meeting all of them
  --client undici|http   HTTP client (default undici; http = node:http, a second implementation)
  --seed N               seed of the Poisson arrivals (default 1)
  --out DIR              writes DIR/result.json and DIR/report.html (default reports/loadtest-<time>)
  --json FILE, --html FILE   explicit output files (either one alone skips the other)
  --progress             live progress line even when stderr is not a TTY
  --quiet                no summary on stdout
  --label TEXT           title of the report
  --spawn                start the gateway (apps/server) with node-sim processes and a fresh key;
                         --url and --key are then ignored; everything is stopped at the end
  --spawn-node-sims K    node-sim processes (default 2; 0 = the embedded simulated swarm)
  --spawn-nodes-per-sim M    nodes in each node-sim process (default 4)
  --spawn-node-args="…" more node-sim flags, e.g. --spawn-node-args="--speed 20 --capacity 64"
  --spawn-env K=V        gateway environment (repeatable), e.g. SWARMGATE_SIM_SPEED=50
  --spawn-cpus LIST      pin the spawned processes with taskset -c LIST
  --help`

const UNITS: Record<string, number> = { us: 0.001, ms: 1, s: 1000, m: 60_000, h: 3_600_000 }

/** `250ms`, `1.5s`, `30s`, `2m`; a bare number is seconds. */
export const parseDuration = (text: string): number => {
  const match = /^(\d+(?:\.\d+)?)(us|ms|s|m|h)?$/.exec(text.trim())
  if (match === null) throw new Error(`not a duration: ${text} (e.g. 500ms, 30s, 2m)`)
  return Number(match[1]) * UNITS[match[2] ?? "s"]!
}

/** `ttft:500,tpot:50,e2el:2000` (milliseconds); keys may also be written `ttft=500`. */
export const parseSlo = (text: string): Slo => {
  const slo: { ttftMillis?: number; tpotMillis?: number; e2elMillis?: number } = {}
  for (const part of text.split(/[,\s]+/).filter((p) => p.length > 0)) {
    const [name, value] = part.split(/[:=]/)
    const millis = value === undefined ? Number.NaN : Number(value)
    if (!(millis > 0)) throw new Error(`--goodput: ${part} needs a positive number of milliseconds`)
    if (name === "ttft") slo.ttftMillis = millis
    else if (name === "tpot") slo.tpotMillis = millis
    else if (name === "e2el" || name === "e2e") slo.e2elMillis = millis
    else throw new Error(`--goodput: unknown metric ${name} (ttft, tpot, e2el)`)
  }
  if (Object.keys(slo).length === 0) throw new Error("--goodput needs at least one of ttft, tpot, e2el")
  return slo
}

/** `http://h:p` → `http://h:p/v1/chat/completions`; a URL that already names the route is kept. */
export const endpointOf = (url: string): string => {
  const trimmed = url.replace(/\/+$/, "")
  if (trimmed.endsWith("/chat/completions")) return trimmed
  return trimmed.endsWith("/v1") ? `${trimmed}/chat/completions` : `${trimmed}/v1/chat/completions`
}

const positive = (name: string, value: string | undefined, fallback: number, integer = true): number => {
  if (value === undefined) return fallback
  const parsed = Number(value)
  if (!(parsed > 0) || (integer && !Number.isInteger(parsed)))
    throw new Error(`--${name} must be a positive ${integer ? "integer" : "number"}: ${value}`)
  return parsed
}

export const DEFAULT_PROMPT = "How do rivers shape valleys? Answer in a few sentences."

export const parseOptions = (
  argv: ReadonlyArray<string>,
  env: Readonly<Record<string, string | undefined>> = process.env,
): CliOptions | "help" => {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      url: { type: "string" },
      key: { type: "string" },
      model: { type: "string" },
      concurrency: { type: "string" },
      rate: { type: "string" },
      duration: { type: "string" },
      warmup: { type: "string" },
      ramp: { type: "string" },
      stream: { type: "boolean" },
      "max-tokens": { type: "string" },
      prompt: { type: "string" },
      extra: { type: "string" },
      timeout: { type: "string" },
      goodput: { type: "string" },
      client: { type: "string" },
      seed: { type: "string" },
      out: { type: "string" },
      json: { type: "string" },
      html: { type: "string" },
      progress: { type: "boolean" },
      quiet: { type: "boolean" },
      label: { type: "string" },
      spawn: { type: "boolean" },
      "spawn-node-sims": { type: "string" },
      "spawn-nodes-per-sim": { type: "string" },
      "spawn-node-args": { type: "string" },
      "spawn-env": { type: "string", multiple: true },
      "spawn-cpus": { type: "string" },
      help: { type: "boolean" },
    },
  })
  if (values.help) return "help"
  const spawn = values.spawn === true
  const url = values.url
  if (!spawn && url === undefined) throw new Error("--url is required (or --spawn)")
  const key = values.key ?? env.SWARMGATE_KEY ?? env.OPENAI_API_KEY
  if (!spawn && key === undefined) throw new Error("--key is required (or $SWARMGATE_KEY, or --spawn)")
  const client = values.client ?? "undici"
  if (client !== "undici" && client !== "http") throw new Error(`--client must be undici or http: ${client}`)
  let extra: Record<string, unknown> = {}
  if (values.extra !== undefined) {
    const parsed = JSON.parse(values.extra) as unknown
    if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
      throw new Error("--extra must be a JSON object")
    extra = parsed as Record<string, unknown>
  }
  const maxTokens = values["max-tokens"] === undefined ? 128 : Number(values["max-tokens"])
  if (!Number.isInteger(maxTokens) || maxTokens < 0)
    throw new Error(`--max-tokens must be a non-negative integer: ${values["max-tokens"]}`)
  const spawnEnv: Record<string, string> = {}
  for (const entry of values["spawn-env"] ?? []) {
    const at = entry.indexOf("=")
    if (at <= 0) throw new Error(`--spawn-env needs KEY=VALUE: ${entry}`)
    spawnEnv[entry.slice(0, at)] = entry.slice(at + 1)
  }
  const nodeSims = values["spawn-node-sims"] === undefined ? 2 : Number(values["spawn-node-sims"])
  if (!Number.isInteger(nodeSims) || nodeSims < 0)
    throw new Error(`--spawn-node-sims must be a non-negative integer: ${values["spawn-node-sims"]}`)
  const durationMillis = parseDuration(values.duration ?? "30s")
  if (!(durationMillis > 0)) throw new Error("--duration must be positive")
  return {
    url: spawn ? "" : endpointOf(url!),
    key: spawn ? "" : key!,
    model: values.model ?? "swarm-prime",
    stream: values.stream === true,
    maxTokens: maxTokens === 0 ? undefined : maxTokens,
    prompt: values.prompt ?? DEFAULT_PROMPT,
    extra,
    concurrency: positive("concurrency", values.concurrency, 8),
    rate: values.rate === undefined ? undefined : positive("rate", values.rate, 1, false),
    durationMillis,
    warmupMillis: parseDuration(values.warmup ?? "0s"),
    rampMillis: parseDuration(values.ramp ?? "0s"),
    timeoutMillis: parseDuration(values.timeout ?? "60s"),
    client,
    slo: values.goodput === undefined ? undefined : parseSlo(values.goodput),
    seed: values.seed === undefined ? 1 : Number(values.seed),
    spawn: spawn
      ? {
          nodeSims,
          nodesPerSim: positive("spawn-nodes-per-sim", values["spawn-nodes-per-sim"], 4),
          nodeSimArgs: (values["spawn-node-args"] ?? "").split(/\s+/).filter((a) => a.length > 0),
          env: spawnEnv,
          cpus: values["spawn-cpus"],
        }
      : undefined,
    jsonPath: values.json,
    htmlPath: values.html,
    outDir: values.out,
    progress: values.progress === true,
    quiet: values.quiet === true,
    label: values.label,
  }
}
