import { describe, expect, it } from "vitest"
import type { Outcome } from "../src/Exchange"
import type { LoadOptions } from "../src/Options"
import { Recorder } from "../src/Recorder"
import { RESULT_SCHEMA, summarize } from "../src/Result"

const outcome = (over: Partial<Outcome>): Outcome => ({
  ok: true,
  status: 200,
  code: undefined,
  startMillis: 0,
  firstTokenMillis: undefined,
  endMillis: 0,
  outputTokens: 0,
  contentChunks: 0,
  ...over,
})

const options: LoadOptions = {
  url: "http://h/v1/chat/completions",
  key: "k",
  model: "m",
  stream: true,
  maxTokens: 64,
  prompt: "p",
  extra: {},
  concurrency: 4,
  rate: undefined,
  durationMillis: 10_000,
  warmupMillis: 1000,
  timeoutMillis: 60_000,
  client: "undici",
  slo: { ttftMillis: 100, tpotMillis: 10 },
  seed: 1,
}

const facts = {
  options,
  label: "t",
  startedAt: new Date(0),
  cpuMicros: 2_000_000,
  loopDelayP99Millis: 1.5,
  maxInFlight: 4,
}

describe("Recorder and summarize", () => {
  it("counts only what ends inside the window, and derives TTFT, TPOT and E2E per request", () => {
    const r = new Recorder(0, 1000, 11_000, options.slo)
    // Ends during the warm-up: charted, not measured.
    r.record(outcome({ startMillis: 0, firstTokenMillis: 50, endMillis: 500, outputTokens: 10 }))
    // TTFT 50, E2E 140, TPOT (140 - 50) / (10 - 1) = 10: within the SLO.
    r.record(outcome({ startMillis: 2000, firstTokenMillis: 2050, endMillis: 2140, outputTokens: 10 }))
    // TTFT 200: outside the SLO.
    r.record(outcome({ startMillis: 3000, firstTokenMillis: 3200, endMillis: 3300, outputTokens: 5 }))
    r.record(
      outcome({ ok: false, status: 429, code: "rate_limit_exceeded", startMillis: 4000, endMillis: 4001 }),
    )
    r.record(outcome({ ok: false, status: 0, code: "connection_reset", startMillis: 4000, endMillis: 4002 }))
    // Ends after the window.
    r.record(outcome({ startMillis: 10_900, firstTokenMillis: 10_950, endMillis: 11_500, outputTokens: 3 }))
    const result = summarize(r, facts)
    expect(result.schema).toBe(RESULT_SCHEMA)
    expect(result.requests).toEqual({
      total: 4,
      succeeded: 2,
      failed: 2,
      throughput_rps: 0.2,
      statuses: { "0": 1, "200": 2, "429": 1 },
    })
    expect(result.tokens.output_total).toBe(15)
    expect(result.latency_ms.ttft).toMatchObject({ count: 2, min: 50, max: 200 })
    expect(result.latency_ms.e2e).toMatchObject({ count: 2, min: 140, max: 300 })
    expect(result.latency_ms.tpot).toMatchObject({ count: 2, min: 10, max: 25 })
    expect(result.errors).toEqual({ rate_limit_exceeded: 1, connection_reset: 1 })
    expect(result.goodput).toEqual({
      slo: { ttft_ms: 100, tpot_ms: 10, e2el_ms: null },
      requests: 1,
      rps: 0.1,
      ratio: 0.25,
    })
    expect(result.client.cpu_percent).toBe(20)
    expect(result.timeseries[0]).toMatchObject({ t: 0, warmup: true, completed: 1, tokens: 10 })
    expect(result.timeseries[4]).toMatchObject({ t: 4, warmup: false, errors: 2 })
    expect(result.timeseries[11]).toMatchObject({ completed: 1 })
  })

  it("records inter-token gaps and chunks by their arrival time", () => {
    const r = new Recorder(0, 1000, 2000, undefined)
    r.token(500, undefined)
    r.token(510, 10)
    r.token(1500, 3)
    r.token(1504, undefined)
    r.token(2500, 1)
    expect(r.chunks).toBe(2)
    expect(r.itl.count).toBe(1)
    expect(r.itl.summaryMillis().p50).toBe(3)
    expect(r.series.map((b) => b.chunks)).toEqual([2, 2, 1])
  })

  it("reports missing metrics as null in JSON", () => {
    const result = summarize(new Recorder(0, 0, 1000, undefined), facts)
    const json = JSON.parse(JSON.stringify(result)) as {
      latency_ms: { ttft: { p50: unknown } }
      goodput: unknown
    }
    expect(json.latency_ms.ttft.p50).toBeNull()
    expect(
      summarize(new Recorder(0, 0, 1000, undefined), { ...facts, options: { ...options, slo: undefined } })
        .goodput,
    ).toBeNull()
  })
})
