// Bench-only preload (`node --import ./bench/counters.mjs …`): counts, inside the gateway process,
// what each request costs in Effect run-loop operations, fibers started, timers set, SQL statements
// run and Redis commands sent, plus garbage collections. Nothing is patched on disk: the counters wrap
// methods at run time. On SIGUSR2 the counts since the last signal are written to stderr as one
// `BENCH-COUNTS {json}` line, and reset.
import { createRequire } from "node:module"
import { pathToFileURL } from "node:url"
import { observeCollections } from "./collections-observer.mjs"

const require = createRequire(`${process.cwd()}/package.json`)
const counts = { ops: 0, fibers: 0, timers: 0, sql: 0, redis: 0, redisWrites: 0, gc: 0, gcMillis: 0 }
/** Redis commands by name (`evalsha`, `publish`, …), reset with the counts. */
let redisByName = {}

// Effect: the bundle and the sources import its ES module build; one fiber gives the runtime's prototype.
const effectEsm = pathToFileURL(require.resolve("effect").replace("/dist/cjs/", "/dist/esm/")).href
const { Effect } = await import(effectEsm)
const proto = Object.getPrototypeOf(Effect.runFork(Effect.void))
for (const name of Object.getOwnPropertyNames(proto)) {
  const original = proto[name]
  if (typeof original !== "function") continue
  // Opcode handlers are the capitalised methods (Sync, OnSuccess, Async, …): one call per run-loop step.
  if (/^[A-Z]/.test(name)) {
    proto[name] = function (op) {
      counts.ops++
      return original.call(this, op)
    }
  } else if (name === "start" || name === "startFork") {
    proto[name] = function (...args) {
      counts.fibers++
      return original.apply(this, args)
    }
  }
}

for (const name of ["setTimeout", "setInterval"]) {
  const original = globalThis[name]
  globalThis[name] = function (...args) {
    counts.timers++
    return original.apply(this, args)
  }
}

try {
  const Database = require("better-sqlite3")
  const prepare = Database.prototype.prepare
  Database.prototype.prepare = function (...args) {
    const statement = prepare.apply(this, args)
    for (const method of ["run", "all", "get", "iterate"]) {
      const original = statement[method]
      if (typeof original === "function")
        statement[method] = function (...a) {
          counts.sql++
          return original.apply(this, a)
        }
    }
    return statement
  }
} catch {}
try {
  const pg = require("pg")
  const query = pg.Client.prototype.query
  pg.Client.prototype.query = function (...args) {
    counts.sql++
    return query.apply(this, args)
  }
} catch {}
try {
  const Redis = require("ioredis")
  const send = (Redis.default ?? Redis).prototype.sendCommand
  ;(Redis.default ?? Redis).prototype.sendCommand = function (...args) {
    counts.redis++
    const name = args[0]?.name ?? "?"
    redisByName[name] = (redisByName[name] ?? 0) + 1
    return send.apply(this, args)
  }
} catch {}

// Round trips: writes that reach sockets to the Redis port (`_write`, or `_writev` for what a corked
// socket gathered: commands sent together are one write, one trip),
// each named by what it carries: the scripts (by SHA, named in BENCH_REDIS_SCRIPTS by the bench) or
// else the commands, e.g. `quota.admit + billing.reserve`.
const redisPort = Number(new URL(process.env.REDIS_URL || "redis://127.0.0.1:6379").port || 6379)
const scriptNames = JSON.parse(process.env.BENCH_REDIS_SCRIPTS || "{}")
let redisWritesBy = {}
const carried = (chunk) => {
  const text = typeof chunk === "string" ? chunk : Buffer.isBuffer(chunk) ? chunk.toString("latin1") : ""
  const names = new Set()
  for (const sha of text.match(/\b[0-9a-f]{40}\b/g) ?? [])
    names.add(scriptNames[sha] ?? `script ${sha.slice(0, 8)}`)
  if (names.size === 0)
    for (const m of text.matchAll(/\*\d+\r\n\$\d+\r\n([A-Za-z]+)\r\n/g)) names.add(m[1].toLowerCase())
  return [...names].sort().join(" + ") || "?"
}
{
  const { Socket } = require("node:net")
  const count = (socket, text) => {
    if (socket.remotePort !== redisPort) return
    counts.redisWrites++
    const what = carried(text)
    redisWritesBy[what] = (redisWritesBy[what] ?? 0) + 1
  }
  const write = Socket.prototype._write
  Socket.prototype._write = function (data, ...rest) {
    count(this, data)
    return write.call(this, data, ...rest)
  }
  const writev = Socket.prototype._writev
  Socket.prototype._writev = function (chunks, ...rest) {
    count(
      this,
      chunks
        .map(({ chunk }) => (typeof chunk === "string" ? chunk : Buffer.from(chunk).toString("latin1")))
        .join(""),
    )
    return writev.call(this, chunks, ...rest)
  }
}

const collections = observeCollections()
let reported = { gc: 0, gcMillis: 0 }

process.on("SIGUSR2", () => {
  const gc = collections.young + collections.other
  counts.gc = gc - reported.gc
  counts.gcMillis = collections.millis - reported.gcMillis
  reported = { gc, gcMillis: collections.millis }
  process.stderr.write(`BENCH-COUNTS ${JSON.stringify({ ...counts, redisByName, redisWritesBy })}\n`)
  for (const key of Object.keys(counts)) counts[key] = 0
  redisByName = {}
  redisWritesBy = {}
})
