import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import { jsonInside } from "../src/internal/JsonText"

describe("jsonInside", () => {
  it("is what JSON.stringify writes between the quotes, for any text (lone surrogates, controls, quotes)", () => {
    const unit = fc.constantFrom(
      "a",
      " ",
      '"',
      "\\",
      "\n",
      "\u0000",
      "\u001f",
      "\u007f",
      "é",
      "😀",
      "\ud83d",
      "\ude00",
      "/",
    )
    fc.assert(
      fc.property(
        fc.oneof(fc.string({ unit, maxLength: 40 }), fc.string({ unit: "binary", maxLength: 40 })),
        (text) => {
          expect(`"${jsonInside(text)}"`).toBe(JSON.stringify(text))
        },
      ),
      { numRuns: 2000 },
    )
  })

  it("gives a text that needs no escape back as it is", () => {
    const text = ` the${"x".repeat(3)}`
    expect(jsonInside(text)).toBe(text)
  })
})
