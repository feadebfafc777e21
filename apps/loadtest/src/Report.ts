/**
 * Turns a result into what people read: a one-screen text summary for the
 * terminal and a self-contained HTML report (inline SVG, no scripts).
 */
import { escapeXml, histogramSvg, lineSvg } from "./Charts"
import type { Summary } from "./Histogram"
import type { LoadResult } from "./Result"

const ms = (value: number | null) => (value === null || !Number.isFinite(value) ? "–" : value.toFixed(3))

const LATENCIES = [
  ["ttft", "TTFT", "Time to first token"],
  ["itl", "ITL", "Inter-token latency"],
  ["tpot", "TPOT", "Time per output token"],
  ["e2e", "E2E", "End-to-end latency"],
] as const

export const textSummary = (result: LoadResult): string => {
  const c = result.config
  const lines = [
    `${result.label ?? "loadtest"}: ${c.endpoint} model=${c.model} ${c.stream ? "stream" : "json"} ${
      c.mode === "closed" ? `closed loop, concurrency ${c.concurrency}` : `open loop, ${c.rate} req/s`
    }, ${result.window_s}s measured`,
    `requests   ${result.requests.succeeded} ok, ${result.requests.failed} failed, ${result.requests.throughput_rps} req/s`,
    `tokens     ${result.tokens.output_total} output, ${result.tokens.output_tps} tok/s${
      c.stream ? `, ${result.tokens.chunks_per_s} chunks/s` : ""
    }`,
    "latency ms      p50        p90        p99       mean",
  ]
  for (const [key, short] of LATENCIES) {
    const s: Summary = result.latency_ms[key]
    if (s.count === 0) continue
    lines.push(
      `${short.padEnd(12)} ${[s.p50, s.p90, s.p99, s.mean].map((v) => ms(v).padStart(10)).join(" ")}`,
    )
  }
  const errors = Object.entries(result.errors)
  if (errors.length > 0) lines.push(`errors     ${errors.map(([code, n]) => `${code}=${n}`).join(" ")}`)
  if (result.goodput !== null)
    lines.push(
      `goodput    ${result.goodput.rps} req/s (${(result.goodput.ratio * 100).toFixed(1)}% within ${sloText(result)})`,
    )
  lines.push(
    `client     ${result.client.cpu_percent}% CPU, loop delay p99 ${ms(result.client.loop_delay_p99_ms)} ms, max in flight ${result.client.max_in_flight}`,
  )
  return lines.join("\n")
}

const sloText = (result: LoadResult) => {
  const slo = result.goodput?.slo
  if (slo === undefined) return ""
  return [
    slo.ttft_ms === null ? undefined : `TTFT ≤ ${slo.ttft_ms} ms`,
    slo.tpot_ms === null ? undefined : `TPOT ≤ ${slo.tpot_ms} ms`,
    slo.e2el_ms === null ? undefined : `E2E ≤ ${slo.e2el_ms} ms`,
  ]
    .filter((s) => s !== undefined)
    .join(", ")
}

const row = (cells: ReadonlyArray<string>, header = false) =>
  `<tr>${cells.map((c) => (header ? `<th>${c}</th>` : `<td>${c}</td>`)).join("")}</tr>`

export const htmlReport = (result: LoadResult): string => {
  const c = result.config
  const title = escapeXml(result.label ?? "swarmgate load test")
  const latencyRows = LATENCIES.map(([key, , name]) => {
    const s = result.latency_ms[key]
    return row([name, String(s.count), ...[s.p50, s.p90, s.p99, s.mean, s.min, s.max].map(ms)])
  })
  const histograms = LATENCIES.filter(([key]) => result.latency_ms[key].count > 0).map(([key, , name]) =>
    histogramSvg({
      title: name,
      bins: result.histograms_ms[key],
      markers: [
        { label: "p50", value: result.latency_ms[key].p50 },
        { label: "p99", value: result.latency_ms[key].p99 },
      ],
    }),
  )
  const series = result.timeseries
  const throughput = lineSvg({
    title: "Throughput over time",
    xLabel: `seconds since start (the first ${c.warmup_s} s are warm-up, not in the metrics)`,
    yLabel: "per second",
    series: [
      { name: "requests/s", points: series.map((b) => [b.t, b.completed] as const) },
      { name: "errors/s", points: series.map((b) => [b.t, b.errors] as const), dashed: true },
    ],
  })
  const tokens = lineSvg({
    title: "Output tokens over time",
    xLabel: "seconds since start",
    yLabel: "tokens/s",
    series: [
      { name: "tokens/s (usage, at completion)", points: series.map((b) => [b.t, b.tokens] as const) },
      ...(c.stream
        ? [{ name: "content chunks/s (on arrival)", points: series.map((b) => [b.t, b.chunks] as const) }]
        : []),
    ],
  })
  const latencyOverTime = lineSvg({
    title: "Mean end-to-end latency over time",
    xLabel: "seconds since start",
    yLabel: "ms",
    series: [{ name: "mean E2E", points: series.map((b) => [b.t, b.e2e_mean_ms] as const) }],
  })
  const errors = Object.entries(result.errors)
  const config = [
    ["endpoint", c.endpoint],
    ["model", c.model],
    ["body", c.stream ? "SSE (include_usage)" : "JSON"],
    ["max_tokens", String(c.max_tokens ?? "not sent")],
    [
      "mode",
      c.mode === "closed"
        ? `closed loop, ${c.concurrency} in flight`
        : `open loop, Poisson ${c.rate} req/s (≤ ${c.concurrency} in flight)`,
    ],
    ["window", `${result.window_s} s after ${c.warmup_s} s warm-up`],
    [
      "client",
      `${c.client}; ${result.client.cpu_percent}% of a core; loop delay p99 ${ms(result.client.loop_delay_p99_ms)} ms`,
    ],
    ["started", result.started_at],
  ]
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${title}</title>
<style>
body{font-family:system-ui,sans-serif;margin:24px;color:#111;max-width:1180px}
table{border-collapse:collapse;margin:8px 0 20px}td,th{border:1px solid #d1d5db;padding:4px 10px;text-align:right}
th{background:#f3f4f6}td:first-child,th:first-child{text-align:left}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{border:1px solid #d1d5db;border-radius:6px;padding:10px 16px}
.card b{display:block;font-size:22px}.charts{display:flex;flex-wrap:wrap;gap:12px}
</style></head><body>
<h1>${title}</h1>
<div class="cards">
<div class="card"><b>${result.requests.throughput_rps}</b>requests/s</div>
<div class="card"><b>${result.tokens.output_tps}</b>output tokens/s</div>
<div class="card"><b>${ms(result.latency_ms.ttft.p50)}</b>TTFT p50 (ms)</div>
<div class="card"><b>${ms(result.latency_ms.e2e.p99)}</b>E2E p99 (ms)</div>
<div class="card"><b>${result.requests.failed}</b>failed of ${result.requests.total}</div>
${result.goodput === null ? "" : `<div class="card"><b>${result.goodput.rps}</b>goodput req/s (${(result.goodput.ratio * 100).toFixed(1)}% within ${escapeXml(sloText(result))})</div>`}
</div>
<h2>Configuration</h2>
<table>${config.map(([k, v]) => row([escapeXml(k!), escapeXml(v!)])).join("")}</table>
<h2>Latency (ms)</h2>
<table>${row(["metric", "samples", "p50", "p90", "p99", "mean", "min", "max"], true)}${latencyRows.join("")}</table>
<h2>Errors</h2>
${errors.length === 0 ? "<p>none</p>" : `<table>${row(["error.code", "count"], true)}${errors.map(([code, n]) => row([escapeXml(code), String(n)])).join("")}</table>`}
<h2>Charts</h2>
<div class="charts">${throughput}${tokens}${latencyOverTime}${histograms.join("")}</div>
</body></html>
`
}
