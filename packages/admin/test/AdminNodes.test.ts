import { describe, expect, it } from "@effect/vitest"
import { Dispatcher, type NodeEvent, Presets, type SwarmNode } from "@swarmgate/dispatch"
import { Effect, Stream } from "effect"
import * as AdminNodes from "../src/AdminNodes"

const presets = Presets.defaultPresets("swarm")

const fake = (id: string): SwarmNode => ({
  id,
  capacity: 2,
  models: new Map([["swarm-prime", id]]),
  vision: false,
  generate: () =>
    Stream.make<Array<NodeEvent>>({ _tag: "Delta", text: "x" }, { _tag: "Finish", reason: "stop" }),
})

const withDispatcher = <A, E>(effect: Effect.Effect<A, E, Dispatcher.Dispatcher>) =>
  Effect.provideService(
    effect,
    Dispatcher.Dispatcher,
    Dispatcher.make(presets, [fake("static-1")], {
      makeNode: (spec) => ({ ...fake(spec.id), url: spec.url, capacity: spec.capacity }),
    }),
  )

const node = { id: "gpu-1", url: "http://10.0.0.5:8000", models: { "swarm-prime": "llama" }, capacity: 4 }

describe("/admin/v1/nodes", () => {
  it.effect("lists nodes with their state, load and health", () =>
    withDispatcher(
      Effect.gen(function* () {
        const listed = yield* AdminNodes.handle("GET", [], undefined)
        expect(listed.status).toBe(200)
        expect((listed.body as { data: Array<unknown> }).data).toEqual([
          {
            id: "static-1",
            object: "node",
            url: null,
            source: "static",
            state: "active",
            circuit: "closed",
            models: { "swarm-prime": "static-1" },
            capacity: 2,
            in_flight: 0,
            vision: false,
            requests: 0,
            failures: 0,
            error_rate: 0,
            ttft_ms: null,
            ttft_p95_ms: null,
            tokens_per_second: null,
            reputation: 0.75,
            hedges: 0,
            last_failure: null,
            expires_at: null,
          },
        ])
      }),
    ),
  )

  it.effect("registers (201), renews (200), shows and drains (202) a node; the key never shows", () =>
    withDispatcher(
      Effect.gen(function* () {
        const created = yield* AdminNodes.handle("POST", [], { ...node, api_key: "secret", ttl_ms: 5_000 })
        expect(created.status).toBe(201)
        expect(created.body).toMatchObject({ id: "gpu-1", source: "registered", url: node.url, capacity: 4 })
        expect(JSON.stringify(created.body)).not.toContain("secret")
        expect((yield* AdminNodes.handle("POST", [], node)).status).toBe(200)
        expect((yield* AdminNodes.handle("GET", ["gpu-1"], undefined)).body).toMatchObject({
          state: "active",
        })
        const drained = yield* AdminNodes.handle("DELETE", ["gpu-1"], undefined)
        expect(drained).toMatchObject({ status: 202, body: { id: "gpu-1", state: "draining" } })
        // Idle, so it is gone at once.
        expect((yield* AdminNodes.handle("GET", ["gpu-1"], undefined)).status).toBe(404)
      }),
    ),
  )

  it.effect("refuses malformed registrations with 400, unknown nodes with 404, other methods with 405", () =>
    withDispatcher(
      Effect.gen(function* () {
        const bad = (body: unknown) => Effect.map(AdminNodes.handle("POST", [], body), (r) => r.status)
        expect(yield* bad(undefined)).toBe(400)
        expect(yield* bad({ ...node, url: "not a url" })).toBe(400)
        expect(yield* bad({ ...node, capacity: 0 })).toBe(400)
        expect(yield* bad({ ...node, ttl_ms: -1 })).toBe(400)
        const conflict = yield* AdminNodes.handle("POST", [], { ...node, id: "static-1" })
        expect(conflict.status).toBe(400)
        expect(conflict.body).toMatchObject({
          error: { code: "invalid_request", message: expect.stringContaining("nodes file") },
        })
        expect((yield* AdminNodes.handle("DELETE", ["nope"], undefined)).body).toMatchObject({
          error: { code: "not_found" },
        })
        expect((yield* AdminNodes.handle("PUT", [], node)).status).toBe(405)
        expect((yield* AdminNodes.handle("GET", ["a", "b"], undefined)).status).toBe(404)
      }),
    ),
  )
})
