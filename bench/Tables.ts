/**
 * The benchmark's results as Markdown tables: cost and throughput against the
 * bare proxy, latency at one connection against the direct node, the scaling
 * curves, the profile, and the issue's targets with what was measured.
 */
import type { AutocannonMeasured } from "./Autocannon"

/** Requests a core serves at this CPU cost: 10⁶ ÷ CPU µs per request (the issue's "requests/s per core"). */
export const requestsPerCore = (row: Pick<Row, "cpuMicrosPerRequest">): number =>
  1e6 / row.cpuMicrosPerRequest

export interface Row {
  readonly mode: string
  readonly target: string
  readonly concurrency: number
  readonly client: string
  readonly rps: number
  readonly chunksPerSecond: number
  readonly outputTps: number
  readonly cpuMicrosPerRequest: number
  readonly cpuMicrosPerChunk: number
  readonly cpuPercent: number
  readonly foreignPercent: number
  readonly rssMiB: number
  readonly hwmMiB: number
  readonly generatorCpuPercent: number
  readonly inFlightAtEnd: number
  readonly streamingAtEnd: number
  readonly errors: Readonly<Record<string, number>>
  readonly failed: number
  readonly total: number
  /** Latencies in µs. */
  readonly e2eP50: number
  readonly e2eP99: number
  readonly ttftP50: number
  readonly ttftP99: number
  readonly itlP50: number
  readonly itlP99: number
  readonly tpotP50: number
}

const fmt = (value: number, digits = 0) =>
  Number.isFinite(value)
    ? value.toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits })
    : "–"

const ratio = (value: number, base: number | undefined) =>
  base === undefined || !Number.isFinite(value) || !Number.isFinite(base) || base === 0
    ? "–"
    : `${fmt(value / base, 2)}×`

/** Rows during which another tenant held more than a fifth of core 1. */
const disturbed = (row: Row) => (row.foreignPercent > 20 ? " ⚠" : "")

const errorText = (row: Row) =>
  row.failed === 0
    ? "0"
    : `${row.failed} (${Object.entries(row.errors)
        .map(([c, n]) => `${c} ${n}`)
        .join(", ")})`

const table = (header: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>) =>
  [
    `| ${header.join(" | ")} |`,
    `|${header.map((_, i) => (i < 2 ? "---" : "---:")).join("|")}|`,
    ...rows.map((r) => `| ${r.join(" | ")} |`),
  ].join("\n")

const find = (rows: ReadonlyArray<Row>, mode: string, target: string) =>
  rows.find((r) => r.mode === mode && r.target === target)

export const throughputTable = (rows: ReadonlyArray<Row>) =>
  table(
    [
      "mode",
      "target",
      "req/s",
      "× proxy",
      "CPU µs/req",
      "× proxy",
      "req/s per core (10⁶ ÷ CPU µs)",
      "CPU %",
      "RSS MiB",
      "× proxy",
      "generator CPU %",
      "other load on core 1 %",
      "errors",
    ],
    rows.map((r) => {
      const proxy = find(rows, r.mode, "bare proxy")
      return [
        r.mode,
        `${r.target}${disturbed(r)}`,
        fmt(r.rps),
        ratio(r.rps, proxy?.rps),
        fmt(r.cpuMicrosPerRequest),
        ratio(r.cpuMicrosPerRequest, proxy?.cpuMicrosPerRequest),
        fmt(requestsPerCore(r)),
        fmt(r.cpuPercent),
        fmt(r.rssMiB),
        ratio(r.rssMiB, proxy?.rssMiB),
        fmt(r.generatorCpuPercent),
        fmt(r.foreignPercent),
        errorText(r),
      ]
    }),
  )

export const latencyTable = (rows: ReadonlyArray<Row>) =>
  table(
    [
      "mode",
      "target",
      "E2E p50",
      "E2E p99",
      "added p50",
      "added p99",
      "added p50 × proxy",
      "TTFT p50",
      "added TTFT p50",
      "ITL p50",
      "TPOT p50",
      "added TPOT p50",
      "CPU µs/req",
    ],
    rows.map((r) => {
      const direct = find(rows, r.mode, "direct")
      const proxy = find(rows, r.mode, "bare proxy")
      const added = (value: number, base: number | undefined) =>
        base === undefined || r.target === "direct" ? "–" : fmt(value - base)
      const stream = r.mode.startsWith("sse")
      return [
        r.mode,
        r.target,
        fmt(r.e2eP50),
        fmt(r.e2eP99),
        added(r.e2eP50, direct?.e2eP50),
        added(r.e2eP99, direct?.e2eP99),
        direct === undefined || proxy === undefined || r.target === "direct"
          ? "–"
          : ratio(r.e2eP50 - direct.e2eP50, proxy.e2eP50 - direct.e2eP50),
        stream ? fmt(r.ttftP50) : "–",
        stream ? added(r.ttftP50, direct?.ttftP50) : "–",
        stream ? fmt(r.itlP50, 1) : "–",
        stream ? fmt(r.tpotP50, 1) : "–",
        stream ? added(r.tpotP50, direct?.tpotP50) : "–",
        fmt(r.cpuMicrosPerRequest),
      ]
    }),
  )

export const ablationTable = (rows: ReadonlyArray<Row>, base: (mode: string) => Row | undefined) =>
  table(
    ["mode", "variant", "req/s", "CPU µs/req", "Δ CPU µs/req vs default", "errors"],
    rows.map((r) => {
      const b = base(r.mode)
      return [
        r.mode,
        r.target,
        fmt(r.rps),
        fmt(r.cpuMicrosPerRequest),
        b === undefined ? "–" : fmt(r.cpuMicrosPerRequest - b.cpuMicrosPerRequest),
        errorText(r),
      ]
    }),
  )

export interface CrossCheck {
  readonly undici: Row
  readonly autocannon: AutocannonMeasured
}

/** `value (+x.x%)`: a figure next to our undici client's. */
const against = (value: number, base: number) =>
  `${fmt(value)} (${value >= base ? "+" : "−"}${fmt((Math.abs(value - base) / base) * 100, 1)}%)`

const autocannonFailures = (a: AutocannonMeasured) => {
  const codes = Object.entries(a.statusCodes).filter(([code]) => !code.startsWith("2"))
  const non2xx = a.non2xx === 0 ? "0" : `**${a.non2xx}** (${codes.map(([c, n]) => `${c} × ${n}`).join(", ")})`
  return a.errors === 0 ? non2xx : `${non2xx}, **${a.errors} socket errors**`
}

export const crossCheckTable = (checks: ReadonlyArray<CrossCheck>) =>
  table(
    [
      "target",
      "connections",
      "our generator req/s",
      "autocannon req/s",
      "our E2E p50 µs",
      "autocannon p50 µs",
      "target CPU µs/req (ours / autocannon)",
      "generator CPU % (ours / autocannon)",
      "autocannon non-2xx",
    ],
    checks.map(({ undici, autocannon }) => {
      const worst = Math.max(undici.foreignPercent, autocannon.foreignPercent)
      return [
        `${undici.target}${worst > 20 ? " ⚠" : ""}`,
        String(undici.concurrency),
        fmt(undici.rps),
        against(autocannon.rps, undici.rps),
        fmt(undici.e2eP50),
        against(autocannon.e2eP50, undici.e2eP50),
        `${fmt(undici.cpuMicrosPerRequest)} / ${fmt(autocannon.cpuMicrosPerRequest)}`,
        `${fmt(undici.generatorCpuPercent)} / ${fmt(autocannon.generatorCpuPercent)}`,
        autocannonFailures(autocannon),
      ]
    }),
  )

export const streamsTable = (rows: ReadonlyArray<Row>) =>
  table(
    [
      "streams",
      "target",
      "streaming / open at end",
      "req/s",
      "tokens/s",
      "CPU %",
      "CPU µs/token",
      "CPU µs/req",
      "RSS MiB",
      "TTFT p50 ms",
      "TTFT p99 ms",
      "ITL p50 ms",
      "ITL p99 ms",
      "errors",
    ],
    rows.map((r) => [
      String(r.concurrency),
      `${r.target}${disturbed(r)}`,
      `${fmt(r.streamingAtEnd)} / ${fmt(r.inFlightAtEnd)}`,
      fmt(r.rps),
      fmt(r.chunksPerSecond),
      fmt(r.cpuPercent),
      fmt(r.cpuMicrosPerChunk, 1),
      fmt(r.cpuMicrosPerRequest),
      fmt(r.rssMiB),
      fmt(r.ttftP50 / 1000, 2),
      fmt(r.ttftP99 / 1000, 2),
      fmt(r.itlP50 / 1000, 2),
      fmt(r.itlP99 / 1000, 2),
      errorText(r),
    ]),
  )

export interface NodesRow extends Row {
  readonly nodes: number
  readonly idlePercent: number
  /** CPU µs per request of each round, where the section ran in rounds (the row is the median round). */
  readonly roundsCpuMicros?: ReadonlyArray<number> | undefined
}

export const nodesTable = (rows: ReadonlyArray<NodesRow>) =>
  table(
    [
      "simulated nodes",
      "idle CPU %",
      "req/s",
      "tokens/s",
      "CPU %",
      "CPU µs/req",
      "CPU µs/token",
      "RSS MiB",
      "errors",
    ],
    rows.map((r) => [
      String(r.nodes),
      fmt(r.idlePercent, 1),
      fmt(r.rps),
      fmt(r.outputTps),
      fmt(r.cpuPercent),
      fmt(r.cpuMicrosPerRequest),
      fmt(r.cpuMicrosPerChunk, 1),
      fmt(r.rssMiB),
      errorText(r),
    ]),
  )

export interface ProfileEntry {
  readonly name: string
  readonly where: string
  readonly selfMillis: number
  readonly share: number
}

export const profileTable = (entries: ReadonlyArray<ProfileEntry>, withWhere: boolean) =>
  table(
    withWhere ? ["self %", "self ms", "function", "where"] : ["self %", "self ms", "area"],
    entries.map((e) =>
      withWhere
        ? [fmt(e.share, 1), fmt(e.selfMillis), `\`${e.name}\``, e.where === "" ? "" : `\`${e.where}\``]
        : [fmt(e.share, 1), fmt(e.selfMillis), e.name],
    ),
  )

export interface Target {
  readonly target: string
  readonly measured: string
  readonly met: boolean | undefined
}

export const targetsTable = (targets: ReadonlyArray<Target>) =>
  table(
    ["target", "measured", "met"],
    targets.map((t) => [
      t.target,
      t.measured,
      t.met === undefined ? "not measured" : t.met ? "yes" : "**no**",
    ]),
  )

export { fmt }
