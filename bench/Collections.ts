/**
 * What requests leave to V8's garbage collector, read from a child started
 * with `node --trace-gc-nvp`: one line per collection of the main isolate,
 * `gc=s` a scavenge (young generation; `mms` / `mmc` too), anything else a
 * mark-sweep or mark-compact (old generation); `allocated=` bytes since the previous
 * collection, `promoted=` bytes moved to the old generation, `pause=` the
 * main thread's pause in ms.
 */
import type { Child } from "../apps/loadtest/src/Spawn"
import { fmt } from "./Tables"

export interface CollectionTotals {
  readonly allocated: number
  readonly promoted: number
  readonly scavenges: number
  readonly scavengeMillis: number
  readonly fullCollections: number
  readonly fullMillis: number
}

const field = (line: string, name: string): number => {
  const at = line.indexOf(` ${name}=`)
  if (at < 0) return 0
  const value = Number.parseFloat(line.slice(at + name.length + 2))
  // V8 prints sizes as unsigned differences: a "negative" one reads as ~1.8e19.
  return Number.isFinite(value) && value <= Number.MAX_SAFE_INTEGER ? value : 0
}

/** Young-generation kinds: `s` (scavenge) and V8's minor mark-sweep / mark-compact (`mms`, `mmc`). */
const isYoung = (kind: string) => kind === "s" || kind.startsWith("mm")

/** One trace line added to `totals`; lines that are not collections leave them as they are. */
export const addLine = (totals: CollectionTotals, line: string): CollectionTotals => {
  const kind = / gc=(\S+)/.exec(line)?.[1]
  if (kind === undefined) return totals
  const pause = field(line, "pause")
  const young = isYoung(kind)
  return {
    allocated: totals.allocated + field(line, "allocated"),
    promoted: totals.promoted + field(line, "promoted"),
    scavenges: totals.scavenges + (young ? 1 : 0),
    scavengeMillis: totals.scavengeMillis + (young ? pause : 0),
    fullCollections: totals.fullCollections + (young ? 0 : 1),
    fullMillis: totals.fullMillis + (young ? 0 : pause),
  }
}

export const noCollections: CollectionTotals = {
  allocated: 0,
  promoted: 0,
  scavenges: 0,
  scavengeMillis: 0,
  fullCollections: 0,
  fullMillis: 0,
}

/** Sums the child's collections as they are reported (its output is read apart from `Child.output`, which is capped). */
export const watchCollections = (child: Child) => {
  let totals = noCollections
  let partial = ""
  child.process.stdout?.on("data", (chunk: Buffer) => {
    const lines = (partial + chunk.toString()).split("\n")
    partial = lines.pop() ?? ""
    for (const line of lines) totals = addLine(totals, line)
  })
  return { totals: () => totals }
}

/** What `bench/gc-counts.mjs` counted, read from a `BENCH-GC {json}` line. */
export interface ObservedCollections {
  readonly young: number
  readonly other: number
}

/** Asks the child (started with `--import bench/gc-counts.mjs`) for its collection counts so far. */
export const observedCollections = (child: Child): Promise<ObservedCollections> =>
  new Promise((resolve, reject) => {
    let seen = ""
    const timer = setTimeout(() => {
      child.process.stderr?.off("data", onData)
      reject(new Error("no BENCH-GC answer within 5 s"))
    }, 5_000)
    const onData = (chunk: Buffer) => {
      seen += chunk.toString()
      const line = seen.split("\n").find((l) => l.startsWith("BENCH-GC "))
      if (line === undefined) return
      clearTimeout(timer)
      child.process.stderr?.off("data", onData)
      resolve(JSON.parse(line.slice("BENCH-GC ".length)) as ObservedCollections)
    }
    child.process.stderr?.on("data", onData)
    child.process.kill("SIGUSR2")
  })

export interface GcRow {
  readonly mode: string
  readonly connections: number
  readonly requests: number
  readonly allocatedKiB: number
  readonly promotedKiB: number
  readonly scavengesPer1000: number
  readonly scavengeMicros: number
  readonly fullPer10000: number
  readonly fullMicros: number
  /** Collections the trace shows against those the process counted itself (fewer: trace lines were lost). */
  readonly traced: number
  readonly observed: number
}

/** The collections between two totals, per successful request. */
export const gcRow = (
  mode: string,
  connections: number,
  requests: number,
  before: CollectionTotals,
  after: CollectionTotals,
  observed: number,
): GcRow => {
  const per = (n: number) => (requests > 0 ? n / requests : 0)
  return {
    mode,
    connections,
    requests,
    allocatedKiB: per(after.allocated - before.allocated) / 1024,
    promotedKiB: per(after.promoted - before.promoted) / 1024,
    scavengesPer1000: per(after.scavenges - before.scavenges) * 1000,
    scavengeMicros: per(after.scavengeMillis - before.scavengeMillis) * 1000,
    fullPer10000: per(after.fullCollections - before.fullCollections) * 10_000,
    fullMicros: per(after.fullMillis - before.fullMillis) * 1000,
    traced: after.scavenges - before.scavenges + after.fullCollections - before.fullCollections,
    observed,
  }
}

export const gcTable = (rows: ReadonlyArray<GcRow>) =>
  [
    "| mode | connections | requests | allocated KiB | promoted KiB | scavenges per 1,000 | scavenge pause µs | full GCs per 10,000 | full GC pause µs | collections traced / counted |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map(
      (r) =>
        `| ${r.mode} | ${r.connections} | ${fmt(r.requests)} | ${fmt(r.allocatedKiB, 1)} | ${fmt(r.promotedKiB, 2)} | ${fmt(r.scavengesPer1000, 1)} | ${fmt(r.scavengeMicros, 1)} | ${fmt(r.fullPer10000, 1)} | ${fmt(r.fullMicros, 1)} | ${r.traced} / ${r.observed}${r.traced < r.observed ? " ⚠" : ""} |`,
    ),
  ].join("\n")
