/** Request ids keep their public shape and sort by time (the ledger's keys grow at one end). */
import { describe, expect, it } from "@effect/vitest"
import { newRequestId } from "../src/RequestId"

describe("newRequestId", () => {
  it("is req_ and 32 hex digits, the first 12 the time in milliseconds", () => {
    const before = Date.now()
    const id = newRequestId()
    const after = Date.now()
    expect(id).toMatch(/^req_[0-9a-f]{32}$/)
    const at = Number.parseInt(id.slice(4, 16), 16)
    expect(at).toBeGreaterThanOrEqual(before)
    expect(at).toBeLessThanOrEqual(after)
  })

  it("sorts ids of different milliseconds by time, and never repeats", async () => {
    const ids: Array<string> = []
    for (let round = 0; round < 5; round++) {
      for (let i = 0; i < 2_000; i++) ids.push(newRequestId())
      await new Promise((resolve) => setTimeout(resolve, 2))
    }
    expect(new Set(ids).size).toBe(ids.length)
    const times = ids.map((id) => id.slice(4, 16))
    expect([...times].sort()).toEqual(times)
    // The random part varies within one millisecond.
    expect(new Set(ids.map((id) => id.slice(16))).size).toBe(ids.length)
  })
})
