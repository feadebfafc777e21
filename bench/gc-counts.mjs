// Bench-only preload (`node --import ./bench/gc-counts.mjs …`): counts the process's garbage
// collections with a PerformanceObserver, young (minor) and the rest, and on SIGUSR2 writes the
// totals so far to stderr as one `BENCH-GC {json}` line. A cross-check for `--trace-gc-nvp`, whose
// lines V8 writes to stdout with C stdio: on a full non-blocking pipe they are dropped unseen.
import { constants, PerformanceObserver } from "node:perf_hooks"

const totals = { young: 0, other: 0 }
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) {
    const kind = entry.detail?.kind
    if (kind === constants.NODE_PERFORMANCE_GC_MINOR) totals.young++
    else totals.other++
  }
}).observe({ entryTypes: ["gc"] })

process.on("SIGUSR2", () => {
  process.stderr.write(`BENCH-GC ${JSON.stringify(totals)}\n`)
})
