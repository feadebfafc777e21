/**
 * What the benchmark reads from Linux about the processes it measures and the
 * machine it runs on: CPU time (/proc/<pid>/stat, in clock ticks), memory
 * (/proc/<pid>/status), per-core busy time (/proc/stat), CPU pinning
 * (taskset), and the machine's description.
 */
import { execFileSync } from "node:child_process"
import { readFileSync } from "node:fs"
import { cpus, totalmem } from "node:os"

const TICK_MICROS =
  1_000_000 / Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim() || 100)

/** User + system CPU time of a process (all its threads), in microseconds (10 ms resolution). */
export const cpuMicros = (pid: number): number => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8")
  // The command name may contain spaces and parentheses: count fields after the last ')'.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  return (Number(fields[11]) + Number(fields[12])) * TICK_MICROS
}

/** Resident and peak resident memory, MiB. */
export const memory = (pid: number): { readonly rssMiB: number; readonly hwmMiB: number } => {
  const status = readFileSync(`/proc/${pid}/status`, "utf8")
  const kib = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+)`, "m").exec(status)?.[1] ?? Number.NaN)
  return { rssMiB: Math.round(kib("VmRSS") / 102.4) / 10, hwmMiB: Math.round(kib("VmHWM") / 102.4) / 10 }
}

/** Busy and total time of one core since boot, microseconds. */
export const coreTimes = (core: number): { readonly busy: number; readonly total: number } => {
  const line = readFileSync("/proc/stat", "utf8")
    .split("\n")
    .find((l) => l.startsWith(`cpu${core} `))
  if (line === undefined) throw new Error(`no cpu${core} in /proc/stat`)
  const [user, nice, system, idle, iowait, irq, softirq, steal] = line
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number)
  const busy = user! + nice! + system! + irq! + softirq! + steal!
  return { busy: busy * TICK_MICROS, total: (busy + idle! + iowait!) * TICK_MICROS }
}

/** Moves every thread of `pid` to the CPU list (e.g. "1"). */
export const pin = (pid: number, cpuList: string): void => {
  execFileSync("taskset", ["-a", "-pc", cpuList, String(pid)], { stdio: "ignore" })
}

export const loadAverage = (): readonly [number, number, number] => {
  const [one, five, fifteen] = readFileSync("/proc/loadavg", "utf8").split(" ").map(Number)
  return [one!, five!, fifteen!]
}

export interface Machine {
  readonly nproc: number
  readonly cpuModel: string
  readonly memoryGiB: number
  readonly node: string
  readonly kernel: string
  readonly clockTickMicros: number
}

export const machine = (): Machine => ({
  // --all: this process is pinned to one core, and plain nproc counts only those it may use.
  nproc: Number(execFileSync("nproc", ["--all"], { encoding: "utf8" }).trim()),
  cpuModel:
    /model name\s*:\s*(.*)/.exec(readFileSync("/proc/cpuinfo", "utf8"))?.[1]?.trim() ??
    cpus()[0]?.model ??
    "?",
  memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
  node: process.version,
  kernel: readFileSync("/proc/sys/kernel/osrelease", "utf8").trim(),
  clockTickMicros: TICK_MICROS,
})

/** CLOCK_MONOTONIC in microseconds: the clock of V8's CPU profiles in every process. */
export const monotonicMicros = (): number => Number(process.hrtime.bigint() / 1000n)
