/**
 * Self-contained SVG charts (no script, no CDN): a histogram on a log time
 * axis and line charts with one or more series. Used by the HTML report and
 * by the benchmark suite for its committed charts.
 */

export const escapeXml = (text: string): string =>
  text.replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]!,
  )

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#ca8a04"]

/** Short numbers for axes: 1.2k, 35, 0.25, 2.5M. */
export const formatNumber = (value: number): string => {
  const abs = Math.abs(value)
  if (abs >= 1e6) return `${trim(value / 1e6)}M`
  if (abs >= 1e3) return `${trim(value / 1e3)}k`
  return trim(value)
}

const trim = (value: number) => {
  const abs = Math.abs(value)
  const digits = abs >= 100 || abs === 0 ? 0 : abs >= 10 ? 1 : abs >= 1 ? 2 : 3
  return String(Number(value.toFixed(digits)))
}

/** 1-2-5 steps covering [lo, hi] with about `count` ticks. */
export const linearTicks = (lo: number, hi: number, count = 5): Array<number> => {
  if (!(hi > lo)) return [lo]
  const raw = (hi - lo) / count
  const magnitude = 10 ** Math.floor(Math.log10(raw))
  const step = [1, 2, 5, 10].map((m) => m * magnitude).find((s) => (hi - lo) / s <= count + 1) ?? raw
  const ticks: Array<number> = []
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    ticks.push(Number(t.toPrecision(12)))
  return ticks
}

/** Powers of ten in [lo, hi], with 2 and 5 between them when the range is short. */
export const logTicks = (lo: number, hi: number): Array<number> => {
  const ticks: Array<number> = []
  const from = Math.floor(Math.log10(lo))
  const to = Math.ceil(Math.log10(hi))
  const steps = to - from <= 3 ? [1, 2, 5] : [1]
  for (let e = from; e <= to; e++)
    for (const m of steps) {
      const t = Number((m * 10 ** e).toPrecision(12))
      if (t >= lo * 0.999 && t <= hi * 1.001) ticks.push(t)
    }
  return ticks.length > 0 ? ticks : [lo, hi]
}

interface Frame {
  readonly width: number
  readonly height: number
  readonly left: number
  readonly right: number
  readonly top: number
  readonly bottom: number
}

const frame = (width: number, height: number): Frame => ({
  width,
  height,
  left: 64,
  right: width - 16,
  top: 34,
  bottom: height - 44,
})

const scale = (lo: number, hi: number, from: number, to: number, log: boolean) => {
  if (log) {
    const a = Math.log(lo)
    const b = Math.log(hi)
    return (v: number) => from + ((Math.log(Math.max(v, lo)) - a) / (b - a || 1)) * (to - from)
  }
  return (v: number) => from + ((v - lo) / (hi - lo || 1)) * (to - from)
}

const axes = (
  f: Frame,
  title: string,
  xLabel: string,
  yLabel: string,
  xTicks: ReadonlyArray<number>,
  yTicks: ReadonlyArray<number>,
  x: (v: number) => number,
  y: (v: number) => number,
): string => {
  const parts = [
    `<text x="${f.width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="600">${escapeXml(title)}</text>`,
    `<line x1="${f.left}" y1="${f.bottom}" x2="${f.right}" y2="${f.bottom}" stroke="#333"/>`,
    `<line x1="${f.left}" y1="${f.top}" x2="${f.left}" y2="${f.bottom}" stroke="#333"/>`,
  ]
  for (const t of xTicks) {
    const px = x(t).toFixed(1)
    parts.push(
      `<line x1="${px}" y1="${f.bottom}" x2="${px}" y2="${f.bottom + 4}" stroke="#333"/>`,
      `<text x="${px}" y="${f.bottom + 16}" text-anchor="middle" font-size="11">${formatNumber(t)}</text>`,
    )
  }
  for (const t of yTicks) {
    const py = y(t).toFixed(1)
    parts.push(
      `<line x1="${f.left}" y1="${py}" x2="${f.right}" y2="${py}" stroke="#e5e7eb"/>`,
      `<text x="${f.left - 6}" y="${py}" text-anchor="end" dominant-baseline="middle" font-size="11">${formatNumber(t)}</text>`,
    )
  }
  parts.push(
    `<text x="${(f.left + f.right) / 2}" y="${f.height - 8}" text-anchor="middle" font-size="12">${escapeXml(xLabel)}</text>`,
    `<text x="14" y="${(f.top + f.bottom) / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 ${(f.top + f.bottom) / 2})">${escapeXml(yLabel)}</text>`,
  )
  return parts.join("")
}

const svg = (f: Frame, title: string, body: string) =>
  `<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="${escapeXml(title)}" width="${f.width}" height="${f.height}" viewBox="0 0 ${f.width} ${f.height}" font-family="system-ui, sans-serif"><title>${escapeXml(title)}</title><rect width="100%" height="100%" fill="#fff"/>${body}</svg>`

const empty = (f: Frame, title: string) =>
  svg(
    f,
    title,
    `<text x="${f.width / 2}" y="20" text-anchor="middle" font-size="14" font-weight="600">${escapeXml(title)}</text><text x="${f.width / 2}" y="${f.height / 2}" text-anchor="middle" font-size="12" fill="#6b7280">no samples</text>`,
  )

export interface HistogramChart {
  readonly title: string
  readonly bins: ReadonlyArray<{ readonly lo: number; readonly hi: number; readonly count: number }>
  readonly xLabel?: string
  readonly width?: number
  readonly height?: number
  /** Vertical markers, e.g. p50 and p99. */
  readonly markers?: ReadonlyArray<{ readonly label: string; readonly value: number }>
}

export const histogramSvg = (chart: HistogramChart): string => {
  const f = frame(chart.width ?? 560, chart.height ?? 260)
  const bins = chart.bins.filter((b) => b.hi > 0)
  if (bins.length === 0 || bins.every((b) => b.count === 0)) return empty(f, chart.title)
  const lo = Math.max(1e-6, bins[0]!.lo)
  const hi = bins[bins.length - 1]!.hi
  const top = Math.max(...bins.map((b) => b.count))
  const x = scale(lo, hi, f.left, f.right, true)
  const yTicks = linearTicks(0, top, 4)
  const y = scale(0, Math.max(top, yTicks[yTicks.length - 1]!), f.bottom, f.top, false)
  const bars = bins
    .filter((b) => b.count > 0)
    .map((b) => {
      const x0 = x(Math.max(lo, b.lo))
      const w = Math.max(1, x(b.hi) - x0 - 1)
      return `<rect x="${x0.toFixed(1)}" y="${y(b.count).toFixed(1)}" width="${w.toFixed(1)}" height="${(f.bottom - y(b.count)).toFixed(1)}" fill="${PALETTE[0]}"><title>${formatNumber(b.lo)}–${formatNumber(b.hi)}: ${b.count}</title></rect>`
    })
  const markers = (chart.markers ?? [])
    .filter((m) => Number.isFinite(m.value) && m.value >= lo && m.value <= hi)
    .map((m, i) => {
      const px = x(m.value).toFixed(1)
      return `<line x1="${px}" y1="${f.top}" x2="${px}" y2="${f.bottom}" stroke="${PALETTE[1 + i]}" stroke-dasharray="4 3"/><text x="${px}" y="${f.top + 10 + i * 12}" font-size="10" fill="${PALETTE[1 + i]}" dx="3">${escapeXml(m.label)}</text>`
    })
  return svg(
    f,
    chart.title,
    axes(f, chart.title, chart.xLabel ?? "ms (log scale)", "requests", logTicks(lo, hi), yTicks, x, y) +
      bars.join("") +
      markers.join(""),
  )
}

export interface LineSeries {
  readonly name: string
  readonly points: ReadonlyArray<readonly [number, number | null]>
  readonly dashed?: boolean
}

export interface LineChart {
  readonly title: string
  readonly series: ReadonlyArray<LineSeries>
  readonly xLabel: string
  readonly yLabel: string
  readonly logX?: boolean
  readonly logY?: boolean
  readonly width?: number
  readonly height?: number
  /** Horizontal reference lines, e.g. a target. */
  readonly references?: ReadonlyArray<{ readonly label: string; readonly value: number }>
}

export const lineSvg = (chart: LineChart): string => {
  const f = frame(chart.width ?? 560, chart.height ?? 280)
  const points = chart.series.flatMap((s) =>
    s.points.filter((p): p is readonly [number, number] => p[1] !== null && Number.isFinite(p[1])),
  )
  if (points.length === 0) return empty(f, chart.title)
  const xs = points.map((p) => p[0])
  const ys = [...points.map((p) => p[1]), ...(chart.references ?? []).map((r) => r.value)]
  const logX = chart.logX === true && Math.min(...xs) > 0
  const logY = chart.logY === true && Math.min(...ys) > 0
  const xLo = Math.min(...xs)
  const xHi = Math.max(...xs, xLo + (logX ? xLo : 1))
  const yLo = logY ? Math.min(...ys) : Math.min(0, ...ys)
  const yTicks = logY ? logTicks(yLo, Math.max(...ys)) : linearTicks(yLo, Math.max(...ys) * 1.05 || 1, 5)
  const yHi = logY ? Math.max(...ys) : Math.max(yTicks[yTicks.length - 1]!, Math.max(...ys))
  const x = scale(xLo, xHi, f.left, f.right, logX)
  const y = scale(yLo, yHi, f.bottom, f.top, logY)
  const xTicks = logX ? logTicks(xLo, xHi) : linearTicks(xLo, xHi, 6)
  const lines = chart.series.map((s, i) => {
    const color = PALETTE[i % PALETTE.length]!
    const valid = s.points.filter(
      (p): p is readonly [number, number] => p[1] !== null && Number.isFinite(p[1]),
    )
    const path = valid.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ")
    const dots =
      valid.length <= 40
        ? valid
            .map(
              (p) =>
                `<circle cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="3" fill="${color}"><title>${escapeXml(s.name)}: ${formatNumber(p[0])} → ${formatNumber(p[1])}</title></circle>`,
            )
            .join("")
        : ""
    const legend = `<rect x="${f.left + 10}" y="${f.top + 4 + i * 15}" width="12" height="3" fill="${color}"/><text x="${f.left + 27}" y="${f.top + 8 + i * 15}" font-size="11">${escapeXml(s.name)}</text>`
    return `<polyline points="${path}" fill="none" stroke="${color}" stroke-width="2"${s.dashed ? ' stroke-dasharray="5 3"' : ""}/>${dots}${legend}`
  })
  const references = (chart.references ?? []).map((r) => {
    const py = y(r.value).toFixed(1)
    return `<line x1="${f.left}" y1="${py}" x2="${f.right}" y2="${py}" stroke="#6b7280" stroke-dasharray="6 4"/><text x="${f.right - 4}" y="${Number(py) - 4}" text-anchor="end" font-size="10" fill="#6b7280">${escapeXml(r.label)}</text>`
  })
  return svg(
    f,
    chart.title,
    axes(f, chart.title, chart.xLabel, chart.yLabel, xTicks, yTicks, x, y) +
      references.join("") +
      lines.join(""),
  )
}
