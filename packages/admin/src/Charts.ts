/**
 * Bar charts as inline SVG, drawn on the server: no script, readable by
 * screen readers (a title and a description), with the numbers in a table
 * beside each chart.
 */
import { h, type Raw } from "./Html"

export interface Bar {
  readonly label: string
  readonly value: number
}

const WIDTH = 560
const HEIGHT = 180
const PAD_LEFT = 8
const PAD_BOTTOM = 22

export const barChart = (
  id: string,
  title: string,
  bars: ReadonlyArray<Bar>,
  format: (n: number) => string,
): Raw => {
  const max = Math.max(0, ...bars.map((b) => b.value))
  const slot = bars.length === 0 ? 0 : (WIDTH - PAD_LEFT) / bars.length
  const barWidth = Math.max(2, slot * 0.7)
  const plot = HEIGHT - PAD_BOTTOM - 14
  const rects = bars.map((bar, i) => {
    const height = max === 0 ? 0 : Math.max(bar.value > 0 ? 1 : 0, (bar.value / max) * plot)
    const x = PAD_LEFT + i * slot + (slot - barWidth) / 2
    const y = HEIGHT - PAD_BOTTOM - height
    return h`<g><rect class="bar" x="${x.toFixed(1)}" y="${y.toFixed(1)}" width="${barWidth.toFixed(1)}" height="${height.toFixed(1)}" fill="#2563eb" data-value="${bar.value}"><title>${bar.label}: ${format(bar.value)}</title></rect>${
      bars.length <= 16
        ? h`<text x="${(x + barWidth / 2).toFixed(1)}" y="${HEIGHT - 6}" font-size="10" text-anchor="middle">${bar.label}</text>`
        : ""
    }</g>`
  })
  const summary =
    bars.length === 0 ? "No data in this period." : `${bars.length} bars; the largest is ${format(max)}.`
  return h`<figure class="chart" id="${id}">
<svg role="img" aria-labelledby="${id}-title ${id}-desc" viewBox="0 0 ${WIDTH} ${HEIGHT}" width="100%" style="max-width:${WIDTH}px;background:#fff;border:1px solid #e5e7eb">
<title id="${id}-title">${title}</title><desc id="${id}-desc">${summary}</desc>
<line x1="${PAD_LEFT}" y1="${HEIGHT - PAD_BOTTOM}" x2="${WIDTH}" y2="${HEIGHT - PAD_BOTTOM}" stroke="#9ca3af"/>
${rects}
</svg><figcaption>${title}</figcaption></figure>`
}
