import { createHash } from "node:crypto"
import { describe, expect, it } from "@effect/vitest"
import fc from "fast-check"
import {
  generateKey,
  hashesEqual,
  hashKey,
  isWellFormed,
  KEY_LENGTH,
  KEY_PREFIX,
  parseBearer,
} from "../src/KeyFormat"

const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
const sample = generateKey().key

describe("KeyFormat", () => {
  it("generates well-formed keys of a fixed 58-character length with a 12-character display prefix", () => {
    expect(KEY_LENGTH).toBe(58)
    for (let i = 0; i < 1000; i++) {
      const { key, hash, prefix } = generateKey()
      expect(key).toMatch(/^sk-swarm-[0-9A-Za-z]{49}$/)
      expect(isWellFormed(key)).toBe(true)
      expect(prefix).toBe(key.slice(0, 12))
      expect(prefix.startsWith(KEY_PREFIX)).toBe(true)
      expect(hash).toBe(hashKey(key))
    }
  })

  it("never repeats a key or a hash over 10,000 generations", () => {
    const keys = new Set<string>()
    const hashes = new Set<string>()
    for (let i = 0; i < 10_000; i++) {
      const { key, hash } = generateKey()
      expect(key.length).toBe(KEY_LENGTH)
      keys.add(key)
      hashes.add(hash)
    }
    expect(keys.size).toBe(10_000)
    expect(hashes.size).toBe(10_000)
  })

  it("refuses a valid key with any single character changed", () => {
    fc.assert(
      fc.property(
        fc.nat({ max: KEY_LENGTH - 1 }),
        fc.string({ unit: "binary", minLength: 1, maxLength: 1 }),
        fc.boolean(),
        (position, replacement, fromAlphabet) => {
          const { key } = generateKey()
          // half the runs replace with a base62 digit, the case the charset check cannot catch
          const char = fromAlphabet ? ALPHABET[replacement.charCodeAt(0) % 62]! : replacement
          fc.pre(key[position] !== char)
          const changed = key.slice(0, position) + char + key.slice(position + 1)
          expect(isWellFormed(changed)).toBe(false)
        },
      ),
      { numRuns: 2000 },
    )
  })

  it("refuses every base62 substitution at every position of one key", () => {
    for (let position = 0; position < KEY_LENGTH; position++) {
      for (const char of ALPHABET) {
        if (sample[position] === char) continue
        expect(isWellFormed(sample.slice(0, position) + char + sample.slice(position + 1))).toBe(false)
      }
    }
  })

  it("refuses a wrong prefix, a wrong length or a foreign character", () => {
    const body = sample.slice(KEY_PREFIX.length)
    expect(isWellFormed(`sk-swarX-${body}`)).toBe(false)
    expect(isWellFormed(`SK-SWARM-${body}`)).toBe(false)
    expect(isWellFormed(`sk-${body}`)).toBe(false)
    expect(isWellFormed(sample.slice(0, -1))).toBe(false)
    expect(isWellFormed(`${sample}0`)).toBe(false)
    expect(isWellFormed(`${sample.slice(0, 20)}-${sample.slice(21)}`)).toBe(false)
    expect(isWellFormed(`${sample.slice(0, 20)}é${sample.slice(21)}`)).toBe(false)
    expect(isWellFormed(` ${sample.slice(1)}`)).toBe(false)
    expect(isWellFormed("")).toBe(false)
    expect(isWellFormed(KEY_PREFIX)).toBe(false)
  })

  it("refuses a key whose checksum belongs to another body", () => {
    const other = generateKey().key
    expect(isWellFormed(sample.slice(0, -6) + other.slice(-6))).toBe(false)
  })

  it("hashes to a stable 64-character hex SHA-256 of the whole key", () => {
    const hash = hashKey(sample)
    expect(hash).toMatch(/^[0-9a-f]{64}$/)
    expect(hashKey(sample)).toBe(hash)
    expect(hash).toBe(createHash("sha256").update(sample).digest("hex"))
    expect(hashKey("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    expect(hashKey(generateKey().key)).not.toBe(hash)
  })

  it("compares hashes for equality, false on any difference including length", () => {
    const hash = hashKey(sample)
    expect(hashesEqual(hash, hashKey(sample))).toBe(true)
    expect(hashesEqual(hash, `${hash.slice(0, -1)}${hash.endsWith("0") ? "1" : "0"}`)).toBe(false)
    expect(hashesEqual(hash, hash.slice(0, -1))).toBe(false)
    expect(hashesEqual(hash, `${hash}0`)).toBe(false)
    expect(hashesEqual("", "")).toBe(true)
    expect(hashesEqual(hash, "zz")).toBe(false)
  })

  it("extracts the token of a Bearer authorization header", () => {
    expect(parseBearer(`Bearer ${sample}`)).toBe(sample)
    expect(parseBearer(`bearer ${sample}`)).toBe(sample)
    expect(parseBearer(`BEARER    ${sample}`)).toBe(sample)
    expect(parseBearer(`  Bearer ${sample}  `)).toBe(sample)
    expect(parseBearer(`Bearer\t${sample}`)).toBe(sample)
  })

  it("gives no token for a missing header, another scheme or a malformed value", () => {
    expect(parseBearer(undefined)).toBeUndefined()
    expect(parseBearer("")).toBeUndefined()
    expect(parseBearer("Bearer")).toBeUndefined()
    expect(parseBearer("Bearer   ")).toBeUndefined()
    expect(parseBearer(`Basic ${Buffer.from("a:b").toString("base64")}`)).toBeUndefined()
    expect(parseBearer(`Bearer${sample}`)).toBeUndefined()
    expect(parseBearer(`Token ${sample}`)).toBeUndefined()
    expect(parseBearer(`Bearer ${sample} extra`)).toBeUndefined()
    expect(parseBearer(sample)).toBeUndefined()
  })
})
