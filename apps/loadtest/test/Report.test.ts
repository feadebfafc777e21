import { describe, expect, it } from "vitest"
import { histogramSvg, linearTicks, lineSvg, logTicks } from "../src/Charts"
import type { LoadOptions } from "../src/Options"
import { Recorder } from "../src/Recorder"
import { htmlReport, textSummary } from "../src/Report"
import { summarize } from "../src/Result"
import { checkMarkup } from "./support"

const options: LoadOptions = {
  url: "http://h/v1/chat/completions",
  key: "k",
  model: "swarm-prime",
  stream: true,
  maxTokens: 64,
  prompt: "p",
  extra: {},
  concurrency: 4,
  rate: undefined,
  durationMillis: 3000,
  warmupMillis: 1000,
  timeoutMillis: 60_000,
  client: "undici",
  slo: { ttftMillis: 100 },
  seed: 1,
}

const sampleResult = () => {
  const r = new Recorder(0, 1000, 4000, options.slo)
  for (let i = 0; i < 200; i++) {
    const start = 1000 + i * 12
    r.token(start + 20 + (i % 7), undefined)
    r.token(start + 25 + (i % 7), 5)
    r.record({
      ok: i % 50 !== 0,
      status: i % 50 === 0 ? 503 : 200,
      code: i % 50 === 0 ? "admission_unavailable" : undefined,
      startMillis: start,
      firstTokenMillis: start + 20 + (i % 7),
      endMillis: start + 40 + (i % 13),
      outputTokens: 2,
      contentChunks: 2,
    })
  }
  return summarize(r, {
    options,
    label: "Smoke <test> & co",
    startedAt: new Date(0),
    cpuMicros: 100_000,
    loopDelayP99Millis: 2,
    maxInFlight: 4,
  })
}

describe("reports", () => {
  it("writes a self-contained, well-formed HTML report with the charts", () => {
    const html = htmlReport(sampleResult())
    expect(checkMarkup(html)).toEqual([])
    expect(html).toContain("<title>Smoke &lt;test&gt; &amp; co</title>")
    expect(html.match(/<svg /g)?.length).toBe(7) // 3 over time + TTFT, ITL, TPOT, E2E histograms
    expect(html).toContain("Throughput over time")
    expect(html).toContain("admission_unavailable")
    expect(html).not.toMatch(/<script|<link|src=|href=|@import/i)
  })

  it("prints a terminal summary with the metrics and the error mix", () => {
    const text = textSummary(sampleResult())
    expect(text).toMatch(/requests\s+196 ok, 4 failed/)
    expect(text).toMatch(/TTFT\s+\d/)
    expect(text).toMatch(/ITL\s+\d/)
    expect(text).toContain("admission_unavailable=4")
    expect(text).toMatch(/goodput/)
  })

  it("draws charts for odd data: empty, one point, nulls", () => {
    expect(checkMarkup(histogramSvg({ title: "none", bins: [] }))).toEqual([])
    expect(histogramSvg({ title: "none", bins: [] })).toContain("no samples")
    const one = lineSvg({ title: "one", xLabel: "x", yLabel: "y", series: [{ name: "s", points: [[1, 5]] }] })
    expect(checkMarkup(one)).toEqual([])
    const gaps = lineSvg({
      title: "log",
      xLabel: "streams",
      yLabel: "µs",
      logX: true,
      series: [
        {
          name: "a",
          points: [
            [10, 1],
            [100, null],
            [1000, 3],
          ],
        },
        {
          name: "b & c",
          points: [
            [10, 2],
            [2000, 4],
          ],
          dashed: true,
        },
      ],
      references: [{ label: "target", value: 2.5 }],
    })
    expect(checkMarkup(gaps)).toEqual([])
    expect(gaps).toContain("b &amp; c")
  })

  it("puts ticks on round numbers", () => {
    expect(linearTicks(0, 100, 5)).toEqual([0, 20, 40, 60, 80, 100])
    expect(linearTicks(0, 0.9, 4)).toEqual([0, 0.2, 0.4, 0.6, 0.8])
    expect(logTicks(10, 2000)).toEqual([10, 20, 50, 100, 200, 500, 1000, 2000])
    expect(logTicks(1, 1e6)).toEqual([1, 10, 100, 1000, 10_000, 100_000, 1_000_000])
  })
})
