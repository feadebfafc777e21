// The process's garbage collections as they happen (a PerformanceObserver on `gc` entries): running
// totals of young (minor) collections, the others, and the milliseconds they took. Shared by the
// bench's preloads (`counters.mjs`, `gc-counts.mjs`).
import { constants, PerformanceObserver } from "node:perf_hooks"

export const observeCollections = () => {
  const totals = { young: 0, other: 0, millis: 0 }
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      if (entry.detail?.kind === constants.NODE_PERFORMANCE_GC_MINOR) totals.young++
      else totals.other++
      totals.millis += entry.duration
    }
  }).observe({ entryTypes: ["gc"] })
  return totals
}
