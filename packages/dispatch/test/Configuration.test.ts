import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { parseNodesFile, readNodesFile } from "../src/NodesFile"
import { applyOverrides, defaultPresets } from "../src/Presets"

const presets = defaultPresets("swarm")

describe("preset overrides (SWARMGATE_PRESETS)", () => {
  it("sets a preset's strategy, running-time limit and consensus parameters, leaving the rest", () => {
    const applied = Either.getOrThrow(
      applyOverrides(presets, {
        "swarm-prime": {
          strategy: "consensus",
          timeout_ms: 90_000,
          consensus: { k: 5, quorum: 3, deadline_ms: 20_000 },
        },
        "swarm-swift": { timeout_ms: 30_000 },
      }),
    )
    expect(applied[0]).toMatchObject({
      id: "swarm-prime",
      strategy: "consensus",
      timeoutMillis: 90_000,
      consensus: { k: 5, quorum: 3, judges: 3, deadlineMillis: 20_000 },
    })
    expect(applied[1]).toMatchObject({ id: "swarm-swift", strategy: "single", timeoutMillis: 30_000 })
    expect(Either.getOrThrow(applyOverrides(presets, {}))).toEqual(presets)
  })

  it("refuses unknown presets, bad values and a quorum above k", () => {
    expect(Either.getLeft(applyOverrides(presets, { "gpt-4o": {} }))).toEqual(
      Either.getLeft(Either.left("unknown preset gpt-4o")),
    )
    expect(Either.isLeft(applyOverrides(presets, { "swarm-prime": { timeout_ms: -5 } }))).toBe(true)
    expect(Either.isLeft(applyOverrides(presets, { "swarm-prime": { strategy: "fastest" } }))).toBe(true)
    expect(applyOverrides(presets, { "swarm-prime": { consensus: { k: 2, quorum: 3 } } })).toEqual(
      Either.left("swarm-prime: quorum above k"),
    )
    expect(Either.isLeft(applyOverrides(presets, [{ "swarm-prime": {} }]))).toBe(true)
    expect(Either.isLeft(applyOverrides(presets, "nope"))).toBe(true)
  })
})

describe("nodes file", () => {
  const entry = {
    id: "gpu-1",
    url: "http://10.0.0.5:8000",
    models: { "swarm-prime": "llama-3.1-70b", "swarm-swift": "llama-3.1-8b" },
    capacity: 8,
  }

  it("reads a JSON list of {id, url, models, capacity, vision?, api_key?}", () => {
    const dir = mkdtempSync(join(tmpdir(), "nodes-"))
    const path = join(dir, "nodes.json")
    writeFileSync(path, JSON.stringify([entry, { ...entry, id: "gpu-2", vision: true, api_key: "k" }]))
    const nodes = Either.getOrThrow(readNodesFile(path))
    expect(nodes.map((n) => n.id)).toEqual(["gpu-1", "gpu-2"])
    expect(nodes[1]).toMatchObject({ vision: true, api_key: "k" })
  })

  it("refuses bad entries with a message naming the problem", () => {
    const refusal = (value: unknown) =>
      Either.getLeft(parseNodesFile(JSON.stringify(value))).pipe((o) => (o._tag === "Some" ? o.value : ""))
    expect(refusal([entry, entry])).toContain("gpu-1 appears twice")
    expect(refusal([{ ...entry, url: "ftp://x" }])).toContain("http(s) URL")
    expect(refusal([{ ...entry, models: {} }])).toContain("at least one preset")
    expect(refusal([{ ...entry, capacity: 0 }])).toMatch(/capacity/)
    expect(refusal([{ ...entry, id: "has space" }])).toContain("an id of letters")
    expect(refusal({ nodes: [] })).not.toBe("")
    expect(Either.getLeft(parseNodesFile("{")).pipe((o) => (o._tag === "Some" ? o.value : ""))).toMatch(
      /^not JSON/,
    )
    expect(
      Either.getLeft(readNodesFile("/no/such/file.json")).pipe((o) => (o._tag === "Some" ? o.value : "")),
    ).toMatch(/^cannot read/)
  })
})
