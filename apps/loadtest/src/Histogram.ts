/**
 * A log-linear histogram in the manner of HdrHistogram: values are integer
 * nanoseconds, exact below 2,048 ns and within 1/1,024 (0.1 %) above, up to
 * about 4.9 hours. Fixed memory whatever the number of samples, and two
 * histograms merge by adding counts.
 */

const SUB_BITS = 10
const SUB_HALF = 1 << SUB_BITS // 1024
const SUB_COUNT = SUB_HALF * 2 // 2048: the exact linear range
const MAX_SHIFT = 34
const SIZE = SUB_COUNT + MAX_SHIFT * SUB_HALF
const MAX_VALUE = 2 ** (MAX_SHIFT + SUB_BITS + 1) - 1

export interface Summary {
  readonly count: number
  readonly min: number
  readonly max: number
  readonly mean: number
  readonly p50: number
  readonly p90: number
  readonly p99: number
}

export interface Bin {
  readonly lo: number
  readonly hi: number
  readonly count: number
}

const indexOf = (value: number): number => {
  if (value < SUB_COUNT) return value
  let shift = Math.floor(Math.log2(value)) - SUB_BITS
  // log2 can round across a power of two; the sub-bucket must land in [1024, 2048).
  if (Math.floor(value / 2 ** shift) >= SUB_COUNT) shift++
  else if (Math.floor(value / 2 ** shift) < SUB_HALF) shift--
  return SUB_COUNT + (shift - 1) * SUB_HALF + (Math.floor(value / 2 ** shift) - SUB_HALF)
}

/** The lowest value and the width of bucket `index`. */
const bucketOf = (index: number): readonly [number, number] => {
  if (index < SUB_COUNT) return [index, 1]
  const shift = Math.floor((index - SUB_COUNT) / SUB_HALF) + 1
  const sub = ((index - SUB_COUNT) % SUB_HALF) + SUB_HALF
  return [sub * 2 ** shift, 2 ** shift]
}

export class Histogram {
  private counts = new Float64Array(SIZE)
  private total = 0
  private sum = 0
  private low = Number.POSITIVE_INFINITY
  private high = Number.NEGATIVE_INFINITY

  /** Records a duration given in milliseconds (stored at nanosecond resolution). */
  recordMillis(millis: number): void {
    this.record(Math.round(millis * 1e6))
  }

  record(nanos: number, times = 1): void {
    const value = Math.min(MAX_VALUE, Math.max(0, Math.round(nanos)))
    this.counts[indexOf(value)]! += times
    this.total += times
    this.sum += value * times
    if (value < this.low) this.low = value
    if (value > this.high) this.high = value
  }

  get count(): number {
    return this.total
  }

  merge(other: Histogram): void {
    for (let i = 0; i < SIZE; i++) this.counts[i]! += other.counts[i]!
    this.total += other.total
    this.sum += other.sum
    this.low = Math.min(this.low, other.low)
    this.high = Math.max(this.high, other.high)
  }

  /** The value at or below which `percent` of the samples lie, in nanoseconds (NaN when empty). */
  percentile(percent: number): number {
    if (this.total === 0) return Number.NaN
    const rank = Math.max(1, Math.ceil((percent / 100) * this.total))
    let seen = 0
    for (let i = 0; i < SIZE; i++) {
      seen += this.counts[i]!
      if (seen >= rank) {
        const [lo, width] = bucketOf(i)
        // The bucket's middle, but never outside what was actually seen.
        return Math.min(this.high, Math.max(this.low, width === 1 ? lo : lo + width / 2))
      }
    }
    return this.high
  }

  /** Count, extremes, mean and percentiles, in milliseconds. */
  summaryMillis(): Summary {
    const ms = (nanos: number) => (Number.isFinite(nanos) ? nanos / 1e6 : Number.NaN)
    return {
      count: this.total,
      min: ms(this.total === 0 ? Number.NaN : this.low),
      max: ms(this.total === 0 ? Number.NaN : this.high),
      mean: ms(this.total === 0 ? Number.NaN : this.sum / this.total),
      p50: ms(this.percentile(50)),
      p90: ms(this.percentile(90)),
      p99: ms(this.percentile(99)),
    }
  }

  /** About `target` bins spaced evenly on a log scale between min and max, in milliseconds. */
  logBinsMillis(target = 40): ReadonlyArray<Bin> {
    if (this.total === 0) return []
    const lo = Math.max(1, this.low)
    const hi = Math.max(lo + 1, this.high + 1)
    const step = (Math.log(hi) - Math.log(lo)) / target
    const bins = Array.from({ length: target }, (_, i) => ({
      lo: Math.exp(Math.log(lo) + i * step),
      hi: Math.exp(Math.log(lo) + (i + 1) * step),
      count: 0,
    }))
    for (let i = 0; i < SIZE; i++) {
      const count = this.counts[i]!
      if (count === 0) continue
      const [start, width] = bucketOf(i)
      const middle = Math.max(lo, start + (width - 1) / 2)
      const at = Math.min(target - 1, Math.max(0, Math.floor((Math.log(middle) - Math.log(lo)) / step)))
      bins[at]!.count += count
    }
    return bins.map((bin) => ({ lo: bin.lo / 1e6, hi: bin.hi / 1e6, count: bin.count }))
  }
}
