// The same Effect programs on the Effect 3 the project runs (`effect`) and on Effect 4
// (`effect-4`, a devDependency alias used by nothing else): CPU µs per unit, so a move to
// Effect 4 can be judged on numbers from this machine. Each version runs in a process of
// its own (`--package effect` or `--package effect-4`) and prints one JSON line.
import { createRequire } from "node:module"
import { parseArgs } from "node:util"

const { values } = parseArgs({
  options: { package: { type: "string", default: "effect" }, scale: { type: "string", default: "1" } },
})
const require = createRequire(import.meta.url)
const { Effect, Fiber, Scope } = await import(values.package)
const version = require(`${values.package}/package.json`).version
const scale = Number(values.scale)

// Names that Effect 4 changed; the programs are otherwise written once.
const fork = Effect.fork ?? Effect.forkChild
const async = Effect.async ?? Effect.callback
const catchAllCause = Effect.catchAllCause ?? Effect.catchCause

const results = []
/** CPU µs of `once` ÷ `per`, after a fifth as many runs of warm-up. */
const measure = async (name, unit, n, per, once) => {
  const count = Math.max(10, Math.round(n * scale))
  for (let i = 0; i < Math.max(5, count / 5); i++) await once()
  const before = process.cpuUsage()
  for (let i = 0; i < count; i++) await once()
  const used = process.cpuUsage(before)
  results.push({ name, unit, cpuMicros: Math.round(((used.user + used.system) / count / per) * 1000) / 1000 })
}
const repeat = (body, n) =>
  Effect.gen(function* () {
    for (let i = 0; i < n; i++) yield* body
  })
const OPS = 1000

await measure("Effect.runPromise(Effect.void)", "fiber", 50_000, 1, () => Effect.runPromise(Effect.void))
await measure("yield* Effect.succeed in Effect.gen", "step", 100, OPS, () =>
  Effect.runPromise(repeat(Effect.succeed(1), OPS)),
)
await measure("Effect.flatMap + Effect.sync", "step", 100, OPS, () => {
  let effect = Effect.succeed(0)
  for (let i = 0; i < OPS; i++) effect = Effect.flatMap(effect, (x) => Effect.sync(() => x + 1))
  return Effect.runPromise(effect)
})
await measure("fork + Fiber.join", "fork", 50, OPS, () =>
  Effect.runPromise(repeat(Effect.flatMap(fork(Effect.void), Fiber.join), OPS)),
)
await measure("Effect.scoped + acquireRelease", "scope", 50, OPS, () =>
  Effect.runPromise(repeat(Effect.scoped(Effect.acquireRelease(Effect.succeed(1), () => Effect.void)), OPS)),
)
// Shaped like one request as the gateway runs it: its own fiber, a scope with a finalizer added
// to it directly (no acquireRelease), 30 steps, one suspended wait for I/O (resumed from a
// setImmediate, as a socket callback would), an uninterruptible region, and the catch that
// renders errors.
const request = catchAllCause(
  Effect.scoped(
    Effect.gen(function* () {
      const scope = yield* Effect.scope
      yield* Scope.addFinalizer(scope, Effect.void)
      let total = 0
      for (let i = 0; i < 30; i++) total += yield* Effect.sync(() => i)
      yield* Effect.uninterruptibleMask((restore) => restore(Effect.void))
      return yield* async((resume) => {
        setImmediate(() => resume(Effect.succeed(total)))
      })
    }),
  ),
  () => Effect.succeed(0),
)
await measure(
  "a request-shaped program (fiber, scope + finalizer, 30 steps, one I/O wait, a mask, catch)",
  "request",
  20_000,
  1,
  () => Effect.runPromise(request),
)
console.log(JSON.stringify({ version, results }))
