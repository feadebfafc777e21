/**
 * Instructions per request, counted by valgrind's callgrind: a measure that
 * other tenants of the machine cannot move, unlike CPU time (which moves 1.5–3×
 * between runs here). The process under test runs under callgrind with
 * instrumentation off; after a warm-up it is switched on (`vgdb`) for a fixed
 * number of requests, then off, and the counts are dumped. Reported: the main
 * thread (JavaScript, HTTP, the event loop: what a request costs), and all
 * threads (V8's concurrent GC and compiler threads too, which vary more).
 * Repeated runs of one build spread up to ~5 % on the main thread (how many
 * requests a turn of the event loop serves, and when V8's compiler threads
 * finish, move with timing), so a change of a few per cent needs several
 * runs of each build. Only user space is counted, not the kernel's socket
 * work (most of what a bare proxy costs): the measure compares builds of
 * swarmgate, not swarmgate to a proxy.
 *
 * Under callgrind a process runs ~50× slower, so each case takes a minute or
 * two; the section is not part of the default run (`--only instructions`).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { request } from "undici"

export interface InstructionsCase {
  readonly target: string
  readonly mode: string
  /** `node` arguments: the script and its own arguments. */
  readonly argv: ReadonlyArray<string>
  readonly env: Readonly<Record<string, string>>
  /** Run once the process listens: returns the bearer key to send ("none" for the proxy). */
  readonly setup?: ((baseUrl: string) => Promise<string>) | undefined
  readonly model: string
  readonly stream: boolean
  readonly chunks: number
}

export interface InstructionsRow {
  readonly target: string
  readonly mode: string
  readonly requests: number
  readonly mainPerRequest: number
  readonly allPerRequest: number
}

export const valgrindAvailable = (): boolean => {
  try {
    execFileSync("valgrind", ["--version"], { stdio: "ignore" })
    execFileSync("vgdb", ["--help"], { stdio: "ignore" })
    return true
  } catch {
    return false
  }
}

/** `n` requests, `concurrency` at a time; throws on any non-200. */
const send = async (
  url: string,
  key: string,
  c: Pick<InstructionsCase, "model" | "stream" | "chunks">,
  n: number,
  concurrency: number,
) => {
  const body = JSON.stringify({
    model: c.model,
    stream: c.stream,
    max_tokens: 256,
    messages: [{ role: "user", content: `Say the word the, over and over. chunks=${c.chunks}` }],
  })
  let left = n
  const worker = async () => {
    while (left-- > 0) {
      const response = await request(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body,
      })
      const text = await response.body.text()
      if (response.statusCode !== 200) throw new Error(`status ${response.statusCode}: ${text.slice(0, 200)}`)
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
}

const waitListening = (child: ChildProcess, millis: number) =>
  new Promise<number>((resolve, reject) => {
    let output = ""
    const timer = setTimeout(() => reject(new Error(`not listening after ${millis} ms: ${output}`)), millis)
    const onData = (data: Buffer) => {
      output += data.toString()
      const match = /"event":"listening"[^\n]*"port":(\d+)/.exec(output)
      if (match) {
        clearTimeout(timer)
        child.stdout?.off("data", onData)
        resolve(Number(match[1]))
      }
    }
    child.stdout?.on("data", onData)
    child.once("exit", (code) => reject(new Error(`exited (${code}) before listening: ${output}`)))
  })

/** `totals:` of one callgrind output file. */
const totals = (file: string): number => {
  const match = /^totals:\s+(\d+)/m.exec(readFileSync(file, "utf8"))
  return match ? Number(match[1]) : 0
}

/**
 * Runs one case under callgrind: `warmup` requests uncounted, then `requests`
 * counted, 8 at a time. Instructions per request of the main thread and of
 * all threads.
 */
export const measureInstructions = async (
  c: InstructionsCase,
  options: { readonly warmup: number; readonly requests: number },
): Promise<InstructionsRow> => {
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-callgrind-"))
  // vgdb finds the process by a file named after the user and host it reads from the environment.
  const identity = { USER: "bench", LOGNAME: "bench", HOST: "127.0.0.1" }
  const prefix = join(dir, "vgdb")
  const child = spawn(
    "valgrind",
    [
      "--tool=callgrind",
      "--instr-atstart=no",
      "--separate-threads=yes",
      "--smc-check=all-non-file",
      "--vgdb=yes",
      `--vgdb-prefix=${prefix}`,
      `--callgrind-out-file=${join(dir, "cg.out")}`,
      process.execPath,
      ...c.argv,
    ],
    { env: { ...process.env, ...c.env, ...identity }, stdio: ["ignore", "pipe", "pipe"] },
  )
  child.stderr?.resume()
  const vgdb = (command: string) =>
    execFileSync("vgdb", [`--vgdb-prefix=${prefix}`, `--pid=${child.pid}`, command], {
      env: { ...process.env, ...identity },
      stdio: "ignore",
    })
  try {
    const port = await waitListening(child, 300_000)
    const url = `http://127.0.0.1:${port}`
    const key = c.setup === undefined ? "none" : await c.setup(url)
    await send(url, key, c, options.warmup, 8)
    vgdb("instrumentation on")
    await send(url, key, c, options.requests, 8)
    vgdb("instrumentation off")
    vgdb("dump")
    const dumps = readdirSync(dir).filter((f) => /^cg\.out\.1-\d+$/.test(f))
    const main = dumps.find((f) => f.endsWith("-01"))
    if (main === undefined) throw new Error(`no callgrind dump in ${dir}`)
    const all = dumps.reduce((sum, f) => sum + totals(join(dir, f)), 0)
    return {
      target: c.target,
      mode: c.mode,
      requests: options.requests,
      mainPerRequest: totals(join(dir, main)) / options.requests,
      allPerRequest: all / options.requests,
    }
  } finally {
    const exited = new Promise((resolve) => child.once("exit", resolve))
    child.kill("SIGKILL")
    await exited
    rmSync(dir, { recursive: true, force: true })
  }
}

const millions = (n: number) => (n / 1e6).toFixed(2)

export const instructionsTable = (rows: ReadonlyArray<InstructionsRow>): string => {
  const proxy = (mode: string) => rows.find((r) => r.mode === mode && r.target === "bare proxy")
  return [
    "| mode | target | requests counted | main thread, M instr./request | × proxy | all threads, M instr./request | × proxy |",
    "|---|---|---:|---:|---:|---:|---:|",
    ...rows.map((r) => {
      const p = proxy(r.mode)
      const ratio = (a: number, b: number | undefined) => (b === undefined ? "–" : `${(a / b).toFixed(2)}×`)
      return `| ${r.mode} | ${r.target} | ${r.requests} | ${millions(r.mainPerRequest)} | ${ratio(r.mainPerRequest, p?.mainPerRequest)} | ${millions(r.allPerRequest)} | ${ratio(r.allPerRequest, p?.allPerRequest)} |`
    }),
  ].join("\n")
}
