import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { IdTable } from "../src/IdTable"

// Ids a client may send as x-request-id: index-like, prototype names, the empty string.
const id = fc.oneof(
  fc.constantFrom("", "0", "7", "42", "__proto__", "constructor", "toString", "hasOwnProperty", "length"),
  fc.string({ maxLength: 4 }),
  fc.uuid(),
)

describe("IdTable", () => {
  it("answers as a Map would under any order of sets, deletes and clears", () => {
    const step = fc.oneof(
      fc.record({ op: fc.constant("set" as const), id, value: fc.integer() }),
      fc.record({ op: fc.constant("delete" as const), id }),
      fc.record({ op: fc.constant("clear" as const) }),
    )
    fc.assert(
      fc.property(fc.array(step, { maxLength: 80 }), fc.array(id, { maxLength: 10 }), (steps, probes) => {
        const table = new IdTable<number>()
        const model = new Map<string, number>()
        for (const s of steps) {
          if (s.op === "set") {
            table.set(s.id, s.value)
            model.set(s.id, s.value)
          } else if (s.op === "delete") {
            expect(table.delete(s.id)).toBe(model.delete(s.id))
          } else {
            table.clear()
            model.clear()
          }
          expect(table.size).toBe(model.size)
        }
        for (const probe of [...probes, ...model.keys()]) {
          expect(table.get(probe)).toBe(model.get(probe))
          expect(table.has(probe)).toBe(model.has(probe))
        }
        expect([...table.values()].sort()).toEqual([...model.values()].sort())
        expect(new Set(table.keys())).toEqual(new Set(model.keys()))
      }),
    )
  })

  it("keeps values that are falsy but defined", () => {
    const table = new IdTable<number | string | boolean>()
    table.set("a", 0)
    table.set("b", "")
    table.set("c", false)
    expect(table.size).toBe(3)
    expect([table.has("a"), table.has("b"), table.has("c")]).toEqual([true, true, true])
    expect(table.get("a")).toBe(0)
  })

  it("lets values be deleted while they are gone through", () => {
    const table = new IdTable<number>()
    for (let i = 0; i < 5; i++) table.set(`req_${i}`, i)
    for (const value of table.values()) if (value % 2 === 0) table.delete(`req_${value}`)
    expect(table.values()).toEqual([1, 3])
    expect(table.size).toBe(2)
  })
})
