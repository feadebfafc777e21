// Bench-only preload (`node --import ./bench/gc-counts.mjs …`): counts the process's garbage
// collections, young (minor) and the rest, and on SIGUSR2 writes the totals so far to stderr as one
// `BENCH-GC {json}` line. A cross-check for `--trace-gc-nvp`, whose lines V8 writes to stdout with
// C stdio: on a full non-blocking pipe they are dropped unseen.
import { observeCollections } from "./collections-observer.mjs"

const totals = observeCollections()

process.on("SIGUSR2", () => {
  process.stderr.write(`BENCH-GC ${JSON.stringify({ young: totals.young, other: totals.other })}\n`)
})
