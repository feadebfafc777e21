/**
 * Node registrations shared through Redis, read by another instance: an entry
 * it cannot read (damaged, or written by another version) is skipped with a
 * warning, not a defect that stops the instance from starting or ends its
 * periodic sync.
 */
import { randomBytes } from "node:crypto"
import { describe, expect, it } from "@effect/vitest"
import { Dispatcher, Presets } from "@swarmgate/dispatch"
import { Redis as R } from "@swarmgate/store"
import { Effect } from "effect"
import * as NodeRegistry from "../src/NodeRegistry"

const redisUrl = process.env.TEST_REDIS_URL?.trim() || undefined
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
if (redisUrl === undefined && !required) console.warn("[skipped] NodeRegistry: TEST_REDIS_URL is not set")

describe.skipIf(redisUrl === undefined && !required)("shared node registrations", () => {
  it.live(
    "an unreadable entry is skipped: the instance starts and registers the others, now and at each sync",
    () =>
      Effect.gen(function* () {
        if (redisUrl === undefined)
          throw new Error("TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)")
        const prefix = `test:nodes:${randomBytes(6).toString("hex")}:`
        const key = `${prefix}{nodes}:registered`
        const client = yield* R.connect(redisUrl, 1_000)
        yield* Effect.addFinalizer(() => R.command(() => client.del(key)).pipe(Effect.ignore))
        const entry = (id: string) =>
          JSON.stringify({
            spec: { id, url: "http://127.0.0.1:9", models: { "swarm-prime": "m" }, capacity: 4 },
            expiresAt: Date.now() + 60_000,
          })
        // Read in this order (a small hash keeps it): the unreadable ones come first.
        yield* R.command(() => client.hset(key, "not-json", "{not json"))
        yield* R.command(() =>
          client.hset(key, "no-spec", JSON.stringify({ spec: { id: "no-spec" }, expiresAt: 1 })),
        )
        yield* R.command(() => client.hset(key, "node-a", entry("node-a")))

        const registry = yield* NodeRegistry.make(Dispatcher.make(Presets.defaultPresets(), []), {
          url: redisUrl,
          prefix,
          syncMillis: 20,
        })
        const ids = Effect.map(registry.status, (nodes) => nodes.map((n) => n.id).sort())
        expect(yield* ids).toEqual(["node-a"])
        // Another instance registers a node later: the periodic sync still runs and finds it.
        yield* R.command(() => client.hset(key, "node-b", entry("node-b")))
        const deadline = Date.now() + 5_000
        while ((yield* ids).length < 2 && Date.now() < deadline) yield* Effect.sleep("20 millis")
        expect(yield* ids).toEqual(["node-a", "node-b"])
      }).pipe(Effect.scoped),
  )
})
