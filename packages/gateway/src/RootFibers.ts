/**
 * Effect 3 keeps every fiber it gives its global fiber scope — each root
 * fiber (here one per request), and daemons and `forkIn`/`forkScoped`
 * fibers too — in one process-wide Set, added as it starts and deleted as
 * it ends, for `Fiber.roots` alone (a debugging aid nothing here reads).
 * Like the drainer's former Map (Drain.ts), a long-lived table that holds
 * each request's fiber makes V8 carry more of the request's objects into
 * the old generation: with the Set, 2.5–2.7 KiB promoted per JSON request at
 * 32 connections; without it, 0.86, and ~2 µs less scavenging per request
 * (CPU per request in alternated rounds moved less than the VM's ±5 %:
 * BENCHMARKS.md, 2026-11-28 21:06). `untrack` turns that bookkeeping off
 * for the whole process (`Fiber.roots` lists no fiber started after it), so
 * the server calls it, not the library: a program that wants `Fiber.roots`
 * leaves it alone.
 */
import { globalValue } from "effect/GlobalValue"

/** Where Effect keeps its global fiber scope (`effect/internal/fiberScope.ts`). */
const GLOBAL_SCOPE = Symbol.for("effect/FiberScope/Global")

interface GlobalScope {
  roots: Set<unknown>
  add: (runtimeFlags: unknown, child: unknown) => void
}

const isGlobalScope = (value: unknown): value is GlobalScope =>
  typeof value === "object" &&
  value !== null &&
  (value as Partial<GlobalScope>).roots instanceof Set &&
  typeof (value as Partial<GlobalScope>).add === "function"

const absent = (): never => {
  throw new Error("no global fiber scope")
}

/**
 * Fibers started from now on are not kept for `Fiber.roots`. Returns the
 * undo (for tests: it puts back what was there, so nested calls undo in
 * turn), or `undefined` when this Effect keeps no such scope where it used
 * to — then nothing changed.
 */
export const untrack = (): (() => void) | undefined => {
  let scope: unknown
  try {
    // Effect made it when it loaded; `absent` only runs (and stores nothing) when it did not.
    scope = globalValue(GLOBAL_SCOPE, absent)
  } catch {
    return undefined
  }
  if (!isGlobalScope(scope)) return undefined
  const tracked = scope
  const before = Object.getOwnPropertyDescriptor(tracked, "add")
  Object.defineProperty(tracked, "add", { value: () => undefined, configurable: true, writable: true })
  return () => {
    if (before === undefined) delete (tracked as Partial<GlobalScope>).add
    else Object.defineProperty(tracked, "add", before)
  }
}
