// The V8 flags the bin sets before the bundle loads. V8 reads each of them at every collection,
// so setting them at run time is in time. Apart from the bin, so that a test can read the choice.

/** An operator's own choice of young-generation threads (in `node` flags or NODE_OPTIONS) wins. */
const OPERATOR_SCAVENGE = /^--(no-)?(parallel[-_]scavenge|single[-_]threaded[-_]gc)(=|$)/

/**
 * @param {{ cpus: number, execArgv: ReadonlyArray<string>, nodeOptions: string | undefined }} process
 * @returns {Array<string>}
 */
export const v8Flags = ({ cpus, execArgv, nodeOptions }) => {
  // V8 allocates objects from allocation sites with a high survival rate straight into the old
  // generation; a request's objects live as long as the request, so they qualified, and from there
  // they kept everything young they point to alive through every scavenge. With it on, the
  // gateway promoted ~20 KB per chat completion instead of ~1 and cost ~25 % more CPU
  // (BENCHMARKS.md, "Found and fixed").
  const flags = ["--no-allocation-site-pretenuring"]
  // On one CPU (a container or `taskset` given one core) the parallel scavenger's helper threads
  // only take turns with the event loop on that core: each young collection pauses it longer
  // (median 0.90 → 0.70 ms at one connection, and the one-connection p99 lower in every round
  // pair; BENCHMARKS.md, ninth session). With more CPUs the helpers shorten the pause.
  const operator = [...execArgv, ...(nodeOptions ?? "").split(/\s+/)]
  if (cpus === 1 && !operator.some((flag) => OPERATOR_SCAVENGE.test(flag)))
    flags.push("--no-parallel-scavenge")
  return flags
}
