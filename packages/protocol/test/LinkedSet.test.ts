import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { type Link, LinkedSet } from "../src/LinkedSet"

describe("LinkedSet", () => {
  it("holds what was added and not removed, in the order added, with its size, under any order of operations", () => {
    // Each step adds a value or removes (possibly again) the link of an earlier add; a clear now and then.
    const step = fc.oneof(
      fc.record({ op: fc.constant("add" as const), value: fc.integer({ min: 0, max: 5 }) }),
      fc.record({ op: fc.constant("remove" as const), index: fc.nat() }),
      fc.record({ op: fc.constant("clear" as const) }),
    )
    fc.assert(
      fc.property(fc.array(step, { maxLength: 60 }), (steps) => {
        const set = new LinkedSet<number>()
        const links: Array<Link<number>> = []
        // The model: the entries still in, oldest first, by the index of the add that made them.
        let model: Array<number> = []
        for (const s of steps) {
          if (s.op === "add") {
            links.push(set.add(s.value))
            model.push(links.length - 1)
          } else if (s.op === "remove") {
            if (links.length === 0) continue
            const at = s.index % links.length
            set.remove(links[at]!)
            model = model.filter((i) => i !== at)
          } else {
            set.clear()
            model = []
          }
          expect(set.size).toBe(model.length)
          expect(set.values()).toEqual(model.map((i) => links[i]!.value))
        }
        const seen: Array<number> = []
        set.forEach((value) => {
          seen.push(value)
        })
        expect(seen).toEqual(set.values())
      }),
    )
  })

  it("lets forEach's callback remove the entry it is given", () => {
    const set = new LinkedSet<string>()
    const links = new Map(["a", "b", "c"].map((v) => [v, set.add(v)]))
    const seen: Array<string> = []
    set.forEach((value) => {
      seen.push(value)
      set.remove(links.get(value)!)
    })
    expect(seen).toEqual(["a", "b", "c"])
    expect(set.size).toBe(0)
  })
})
