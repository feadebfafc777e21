/**
 * The plain metric families scrape to exactly the text (and JSON) prom-client's
 * own Counter, Gauge and Histogram give for the same updates.
 */
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { Counter, Gauge, Histogram, Registry } from "prom-client"
import * as Metrics from "../src/Metrics"
import { CounterFamily, HistogramFamily, PlainGauge } from "../src/PlainMetrics"

const BOUNDS = [0.005, 0.025, 0.1, 0.25, 1, 2.5]

type Update =
  | { readonly kind: "count"; readonly route: string; readonly code: string; readonly by: number }
  | { readonly kind: "observe"; readonly route: string; readonly value: number }
  | { readonly kind: "gauge"; readonly by: number }

const label = fc.constantFrom("/v1/chat/completions", "/v1/models", 'odd "quoted"\\ \nvalue', "")
const update: fc.Arbitrary<Update> = fc.oneof(
  fc.record({
    kind: fc.constant("count" as const),
    route: label,
    code: fc.constantFrom("", "rate_limit_exceeded", "upstream_error"),
    by: fc.integer({ min: 0, max: 1_000 }),
  }),
  fc.record({
    kind: fc.constant("observe" as const),
    route: label,
    // Bounds themselves included: a value equal to a bound is in that bucket.
    value: fc.oneof(fc.constantFrom(...BOUNDS, 0, 400), fc.double({ min: 0, max: 500, noNaN: true })),
  }),
  fc.record({ kind: fc.constant("gauge" as const), by: fc.constantFrom(1, -1) }),
)

const both = (updates: ReadonlyArray<Update>) => {
  const reference = new Registry()
  const counter = new Counter({
    name: "t_total",
    help: "a counter",
    labelNames: ["route", "code"],
    registers: [reference],
  })
  const histogram = new Histogram({
    name: "t_seconds",
    help: "a histogram",
    labelNames: ["route"],
    buckets: BOUNDS,
    registers: [reference],
  })
  const gauge = new Gauge({ name: "t_in_flight", help: "a gauge", registers: [reference] })

  const plain = new Registry()
  const counters = new CounterFamily("t_total", "a counter", ["route", "code"], plain)
  const histograms = new HistogramFamily("t_seconds", "a histogram", ["route"], BOUNDS, plain)
  const plainGauge = new PlainGauge("t_in_flight", "a gauge", plain)

  for (const u of updates) {
    if (u.kind === "count") {
      counter.labels(u.route, u.code).inc(u.by)
      counters.at(`${u.route}\u0000${u.code}`, [u.route, u.code]).value += u.by
    } else if (u.kind === "observe") {
      histogram.labels(u.route).observe(u.value)
      histograms.at(u.route, [u.route]).observe(u.value)
    } else {
      gauge.inc(u.by)
      plainGauge.value += u.by
    }
  }
  return { reference, plain }
}

describe("plain metric families", () => {
  it("scrape to prom-client's text and JSON for the same updates", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(update, { maxLength: 60 }), async (updates) => {
        const { reference, plain } = both(updates)
        expect(await plain.metrics()).toBe(await reference.metrics())
        expect(await plain.getMetricsAsJSON()).toEqual(await reference.getMetricsAsJSON())
      }),
      { numRuns: 200 },
    )
  })

  it("reset as prom-client's do", async () => {
    const { reference, plain } = both([
      { kind: "count", route: "/v1/models", code: "", by: 3 },
      { kind: "observe", route: "/v1/models", value: 0.2 },
      { kind: "gauge", by: 1 },
    ])
    reference.resetMetrics()
    plain.resetMetrics()
    expect(await plain.metrics()).toBe(await reference.metrics())
  })

  it("the gateway's counts are the observations' sums, through any mix and a reset anywhere", async () => {
    const observationArb = fc.record({
      route: fc.constantFrom("/v1/chat/completions", "/v1/models"),
      model: fc.constantFrom("", "swarm-prime", "swarm-swift"),
      status: fc.constantFrom(200, 400, 429, 504),
      code: fc.constantFrom("", "rate_limit_exceeded", "upstream_timeout"),
      durationSeconds: fc.double({ min: 0, max: 1, noNaN: true }),
      ttftSeconds: fc.option(fc.double({ min: 0, max: 1, noNaN: true }), { nil: undefined }),
      promptTokens: fc.option(fc.nat(1000), { nil: undefined }),
      completionTokens: fc.option(fc.nat(1000), { nil: undefined }),
      costMicros: fc.option(fc.nat(10_000), { nil: undefined }),
    })
    await fc.assert(
      fc.asyncProperty(
        fc.array(observationArb, { maxLength: 40 }),
        fc.nat(40),
        async (observations, resetAt) => {
          const metrics = Metrics.make({ processMetrics: false })
          const counted = new Map<string, number>()
          const add = (line: string, by: number) => counted.set(line, (counted.get(line) ?? 0) + by)
          observations.forEach((o, i) => {
            if (i === resetAt) {
              metrics.registry.resetMetrics()
              counted.clear()
            }
            metrics.observe(o)
            add(
              `swarmgate_requests_total{route="${o.route}",model="${o.model}",status="${o.status}",code="${o.code}"}`,
              1,
            )
            add(`swarmgate_request_duration_seconds_count{route="${o.route}",model="${o.model}"}`, 1)
            if (o.model === "") return
            if (o.ttftSeconds !== undefined)
              add(`swarmgate_time_to_first_token_seconds_count{model="${o.model}"}`, 1)
            if (o.costMicros !== undefined) {
              add(`swarmgate_tokens_total{model="${o.model}",kind="prompt"}`, o.promptTokens ?? 0)
              add(`swarmgate_tokens_total{model="${o.model}",kind="completion"}`, o.completionTokens ?? 0)
              add(`swarmgate_charged_micros_total{model="${o.model}"}`, o.costMicros)
            }
          })
          const text = await metrics.registry.metrics()
          const scraped = new Map<string, number>()
          for (const line of text.split("\n")) {
            const m =
              /^(swarmgate_(?:requests_total|request_duration_seconds_count|time_to_first_token_seconds_count|tokens_total|charged_micros_total)\{[^}]*\}) (\S+)$/.exec(
                line,
              )
            if (m !== null) scraped.set(m[1]!, Number(m[2]))
          }
          expect(scraped).toEqual(counted)
        },
      ),
      { numRuns: 300 },
    )
  })

  it("a request's observation reaches the gateway's scrape", async () => {
    const metrics = Metrics.make({ processMetrics: false })
    const observation: Metrics.Observation = {
      route: "/v1/chat/completions",
      model: "swarm-prime",
      status: 200,
      code: "",
      durationSeconds: 0.02,
      ttftSeconds: 0.01,
      promptTokens: 12,
      completionTokens: 20,
      costMicros: 31,
    }
    metrics.observe(observation)
    metrics.observe({
      ...observation,
      status: 429,
      code: "rate_limit_exceeded",
      ttftSeconds: undefined,
      costMicros: undefined,
    })
    metrics.inFlight.inc()
    const text = await metrics.registry.metrics()
    const line = (name: string) => text.split("\n").find((l) => l.startsWith(name))
    expect(
      line('swarmgate_requests_total{route="/v1/chat/completions",model="swarm-prime",status="200",code=""}'),
    ).toMatch(/ 1$/)
    expect(
      line(
        'swarmgate_request_duration_seconds_bucket{le="0.025",route="/v1/chat/completions",model="swarm-prime"}',
      ),
    ).toMatch(/ 2$/)
    expect(line('swarmgate_request_duration_seconds_bucket{le="0.005"')).toMatch(/ 0$/)
    expect(line('swarmgate_time_to_first_token_seconds_count{model="swarm-prime"}')).toMatch(/ 1$/)
    expect(line('swarmgate_tokens_total{model="swarm-prime",kind="completion"}')).toMatch(/ 20$/)
    expect(line('swarmgate_charged_micros_total{model="swarm-prime"}')).toMatch(/ 31$/)
    expect(line('swarmgate_limiter_refusals_total{code="rate_limit_exceeded"}')).toMatch(/ 1$/)
    expect(line("swarmgate_requests_in_flight")).toMatch(/ 1$/)
    expect(line("swarmgate_requests_queued")).toMatch(/ 0$/)
  })
})
