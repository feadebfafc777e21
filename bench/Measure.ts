/**
 * One measurement: the process under test alone on core 1, everything else
 * (this generator, the node behind a proxy) on core 0, a load test from this
 * process, and the process's own CPU time and memory over exactly the
 * measured window.
 */
import type { LoadOptions } from "../apps/loadtest/src/Options"
import type { LoadResult } from "../apps/loadtest/src/Result"
import { run } from "../apps/loadtest/src/Runner"
import { coreTimes, cpuMicros, memory, monotonicMicros, pin } from "./Procfs"

export const CORE_UNDER_TEST = 1
export const CORE_GENERATOR = 0

export interface Measured {
  readonly result: LoadResult
  /** CPU time of the process under test per successful request / per content chunk, µs. */
  readonly cpuMicrosPerRequest: number
  readonly cpuMicrosPerChunk: number
  /** Its CPU use over the window, % of one core. */
  readonly cpuPercent: number
  /** What else ran on its core meanwhile, % of the core (other tenants of the machine). */
  readonly foreignPercent: number
  readonly rssMiB: number
  readonly hwmMiB: number
  /** CLOCK_MONOTONIC µs of the window, to cut a CPU profile to it. */
  readonly windowMicros: { readonly fromMicros: number; readonly toMicros: number }
}

/** Every managed process on core 0 except `underTest` on core 1. */
export const pinAll = (pids: ReadonlyArray<number>, underTest: number) => {
  for (const pid of pids) pin(pid, String(pid === underTest ? CORE_UNDER_TEST : CORE_GENERATOR))
}

export const measure = async (
  options: LoadOptions,
  underTest: number,
  others: ReadonlyArray<number>,
): Promise<Measured> => {
  pinAll([...others, underTest], underTest)
  await new Promise((r) => setTimeout(r, 200))
  let from = { cpu: 0, core: { busy: 0, total: 0 }, at: 0 }
  let to = from
  const snapshot = () => ({
    cpu: cpuMicros(underTest),
    core: coreTimes(CORE_UNDER_TEST),
    at: monotonicMicros(),
  })
  const result = await run(options, {
    onWindow: (edge) => {
      if (edge === "start") from = snapshot()
      else to = snapshot()
    },
  })
  const mem = memory(underTest)
  const cpu = to.cpu - from.cpu
  const coreTotal = Math.max(1, to.core.total - from.core.total)
  const window = Math.max(1, to.at - from.at)
  return {
    result,
    cpuMicrosPerRequest: result.requests.succeeded === 0 ? Number.NaN : cpu / result.requests.succeeded,
    cpuMicrosPerChunk: result.tokens.content_chunks === 0 ? Number.NaN : cpu / result.tokens.content_chunks,
    cpuPercent: (cpu / window) * 100,
    foreignPercent: Math.max(0, ((to.core.busy - from.core.busy - cpu) / coreTotal) * 100),
    rssMiB: mem.rssMiB,
    hwmMiB: mem.hwmMiB,
    windowMicros: { fromMicros: from.at, toMicros: to.at },
  }
}

/** Idle CPU of a process over `millis` (background work: probes, timers), % of one core. */
export const idlePercent = async (pid: number, millis: number): Promise<number> => {
  const before = cpuMicros(pid)
  await new Promise((r) => setTimeout(r, millis))
  return ((cpuMicros(pid) - before) / (millis * 1000)) * 100
}
