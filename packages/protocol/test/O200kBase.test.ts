/**
 * The o200k_base table read from the library's data file is the table of its
 * generated module, rank for rank (the counts built on it are compared with
 * the library's own in FuzzTokens.test.ts).
 */
import { readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { describe, expect, it } from "@effect/vitest"
import generated from "gpt-tokenizer/bpeRanks/o200k_base"
import { encoding, parseRanks } from "../src/internal/O200kBase"

const line = (bytes: ReadonlyArray<number>, rank: number) =>
  `${Buffer.from(bytes).toString("base64")} ${rank}`

describe("O200kBase", () => {
  it("reads the data file into the generated module's table, rank for rank", () => {
    const file = createRequire(import.meta.url).resolve("gpt-tokenizer/data/o200k_base.tiktoken")
    const ranks = parseRanks(readFileSync(file, "latin1"))
    const expected = generated as ReadonlyArray<string | ReadonlyArray<number>>
    expect(ranks.length).toBe(expected.length)
    let differing = 0
    for (let rank = 0; rank < expected.length; rank++) {
      const want = expected[rank]!
      const got = ranks[rank]!
      const same =
        typeof want === "string"
          ? got === want
          : Array.isArray(got) && got.length === want.length && got.every((b, i) => b === want[i])
      if (!same) differing++
    }
    expect(differing).toBe(0)
    // Both kinds occur: texts and byte sequences (a part of a character, a byte-order mark).
    expect(ranks.some((r) => typeof r !== "string")).toBe(true)
  })

  it("keeps as bytes what is not a character on its own, or starts with a byte-order mark", () => {
    const ranks = parseRanks(
      [
        line([0x68, 0x69], 0),
        line([0xe6, 0xbc], 1),
        line([0xef, 0xbb, 0xbf, 0x61], 2),
        line([0xc3, 0xa9], 3),
        line([0x20, 0xf0, 0x9f, 0x98, 0x80], 5),
      ].join("\n"),
    )
    expect(ranks).toEqual(["hi", [0xe6, 0xbc], [0xef, 0xbb, 0xbf, 0x61], "é", "", " 😀"])
  })

  it("refuses a line without a rank, and a bad or repeated rank", () => {
    expect(() => parseRanks("aGk=\n")).toThrow(/malformed/)
    expect(() => parseRanks("aGk= x\n")).toThrow(/bad or repeated/)
    expect(() => parseRanks("aGk= 1\naGk= 1\n")).toThrow(/bad or repeated/)
    expect(() => parseRanks("aGk= 2\naGk= 1\n")).toThrow(/bad or repeated/)
  })

  it("encodes and decodes with the table", () => {
    const ids = encoding.encode("Hello, world! Ünïcode 漢字")
    expect(encoding.decode(ids)).toBe("Hello, world! Ünïcode 漢字")
    expect(encoding.countTokens("Hello, world!")).toBe(4)
  })
})
