/**
 * Metric families whose children are plain numbers, registered with a
 * prom-client `Registry`, which reads them only when scraped. prom-client's
 * own `inc` / `observe` validate and hash the labels on every call, also
 * through a bound child (`labels(…)` binds the label object, not its hash):
 * with six updates per chat completion that was ~3–4 % of its CPU. Here an
 * update is a map lookup by a key the caller already has and a few additions.
 *
 * The exposition is prom-client's (its `Registry` formats what `get` and
 * `getForPromString` return, in the same shapes as its Counter, Gauge and
 * Histogram): test/PlainMetrics.test.ts holds both to the same text.
 */
import type { Registry } from "prom-client"

interface Sample {
  readonly labels: Readonly<Record<string, string | number>>
  readonly value: number
  readonly metricName?: string
  readonly sharedLabels?: Readonly<Record<string, string>>
  /** prom-client's buckets carry `null` (no exemplar). */
  readonly exemplar?: null
}

interface Exported {
  readonly name: string
  readonly help: string
  readonly type: "counter" | "gauge" | "histogram"
  readonly values: ReadonlyArray<Sample>
  readonly aggregator: "sum"
}

/** One label set's running value. */
export class Cell {
  value = 0
  constructor(readonly labels: Readonly<Record<string, string>>) {}
}

const labelsOf = (names: ReadonlyArray<string>, values: ReadonlyArray<string>) => {
  const labels: Record<string, string> = {}
  for (let i = 0; i < names.length; i++) labels[names[i]!] = values[i]!
  return labels
}

/**
 * prom-client types `registerMetric` as its own classes; its registry reads
 * only `name`, `help`, `type`, `aggregator`, `get`, `getForPromString` and
 * `reset`, which the families below have (the test scrapes them side by side).
 */
const register = (registry: Registry, metric: object) => registry.registerMetric(metric as never)

abstract class Family<C> {
  readonly aggregator = "sum" as const
  protected cells = new Map<string, C>()
  private readonly resetListeners: Array<() => void> = []
  constructor(
    readonly name: string,
    readonly help: string,
    readonly labelNames: ReadonlyArray<string>,
    registry: Registry,
  ) {
    register(registry, this)
  }

  protected abstract make(labels: Readonly<Record<string, string>>): C

  /**
   * The child of `values` (in `labelNames` order), found by `key`: any string
   * that is one-to-one with the values (the caller's, so that it builds it once).
   */
  at(key: string, values: ReadonlyArray<string>): C {
    let cell = this.cells.get(key)
    if (cell === undefined) {
      cell = this.make(labelsOf(this.labelNames, values))
      this.cells.set(key, cell)
    }
    return cell
  }

  /** prom-client's `Registry.resetMetrics`. */
  reset(): void {
    this.cells = new Map()
    for (const listener of this.resetListeners) listener()
  }

  /** Called after each reset: a caller that keeps children must let go of them then. */
  onReset(listener: () => void): void {
    this.resetListeners.push(listener)
  }
}

export class CounterFamily extends Family<Cell> {
  readonly type = "counter" as const
  protected make(labels: Readonly<Record<string, string>>) {
    return new Cell(labels)
  }
  get(): Exported {
    const values: Array<Sample> = []
    for (const cell of this.cells.values()) values.push({ labels: cell.labels, value: cell.value })
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator }
  }
}

/** A gauge without labels (prom-client reports 0 before any update, as here). */
export class PlainGauge {
  readonly type = "gauge" as const
  readonly aggregator = "sum" as const
  readonly labelNames: ReadonlyArray<string> = []
  value = 0
  constructor(
    readonly name: string,
    readonly help: string,
    registry: Registry,
  ) {
    register(registry, this)
  }
  get(): Exported {
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values: [{ labels: {}, value: this.value }],
      aggregator: this.aggregator,
    }
  }
  reset(): void {
    this.value = 0
  }
}

/** One label set's histogram: a count per bucket (not cumulative), the sum and the count. */
export class Buckets {
  readonly counts: Array<number>
  sum = 0
  count = 0
  constructor(
    readonly labels: Readonly<Record<string, string>>,
    private readonly bounds: ReadonlyArray<number>,
  ) {
    this.counts = bounds.map(() => 0)
  }
  /** As prom-client's `observe`, except that a value that is not a finite number is dropped, not thrown. */
  observe(value: number): void {
    if (!Number.isFinite(value)) return
    const bounds = this.bounds
    for (let i = 0; i < bounds.length; i++) {
      if (value <= bounds[i]!) {
        this.counts[i]!++
        break
      }
    }
    this.sum += value
    this.count++
  }
}

export class HistogramFamily extends Family<Buckets> {
  readonly type = "histogram" as const
  constructor(
    name: string,
    help: string,
    labelNames: ReadonlyArray<string>,
    readonly upperBounds: ReadonlyArray<number>,
    registry: Registry,
  ) {
    super(name, help, labelNames, registry)
  }
  protected make(labels: Readonly<Record<string, string>>) {
    return new Buckets(labels, this.upperBounds)
  }
  /** What prom-client's Registry formats: the child's labels after `le`, then `_sum` and `_count`. */
  getForPromString(): Exported {
    const values: Array<Sample> = []
    const bucket = `${this.name}_bucket`
    for (const cell of this.cells.values()) {
      let total = 0
      for (let i = 0; i < this.upperBounds.length; i++) {
        total += cell.counts[i]!
        values.push({
          labels: { le: this.upperBounds[i]! },
          value: total,
          metricName: bucket,
          sharedLabels: cell.labels,
          exemplar: null,
        })
      }
      values.push({
        labels: { le: "+Inf" },
        value: cell.count,
        metricName: bucket,
        sharedLabels: cell.labels,
        exemplar: null,
      })
      values.push({ labels: {}, value: cell.sum, metricName: `${this.name}_sum`, sharedLabels: cell.labels })
      values.push({
        labels: {},
        value: cell.count,
        metricName: `${this.name}_count`,
        sharedLabels: cell.labels,
      })
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator }
  }
  /** `getForPromString` with each sample's labels in one object (prom-client's JSON form). */
  get(): Exported {
    const data = this.getForPromString()
    return {
      ...data,
      values: data.values.map(({ labels, sharedLabels, ...sample }) => ({
        ...sample,
        labels: { ...labels, ...sharedLabels },
      })),
    }
  }
}
