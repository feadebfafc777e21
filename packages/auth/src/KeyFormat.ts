/**
 * API key format: `sk-swarm-` + 43-character base62 body + 6-character
 * base62 checksum, 58 characters in all.
 *
 * - The body encodes 32 random bytes (256 bits; 62^43 > 2^256, so 43 digits
 *   always suffice), left-padded with "0" to a fixed width.
 * - The checksum is the CRC32 of the body, base62, padded to 6 digits
 *   (62^6 > 2^32). It lets the gateway refuse a mistyped or truncated key
 *   without touching the database; it is not a secret and proves nothing.
 * - Only the SHA-256 hex digest of the whole key is stored; a plain hash is
 *   enough because the key carries 256 bits of entropy (no salt or slow KDF).
 *
 * Alphabet: 0-9, A-Z, a-z.
 *
 * @since 0.1.0
 */
import * as crypto from "node:crypto"
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import { crc32 } from "node:zlib"

export const KEY_PREFIX = "sk-swarm-"

/** Base62 digits of the random body. */
export const KEY_BODY_LENGTH = 43

/** Base62 digits of the CRC32 checksum. */
export const KEY_CHECKSUM_LENGTH = 6

/** Total length of every key: 9 + 43 + 6 = 58. */
export const KEY_LENGTH = KEY_PREFIX.length + KEY_BODY_LENGTH + KEY_CHECKSUM_LENGTH

/** Length of the display prefix shown in listings and logs, e.g. "sk-swarm-AbC". */
export const DISPLAY_PREFIX_LENGTH = 12

const ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
const BODY_START = KEY_PREFIX.length
const CHECKSUM_START = BODY_START + KEY_BODY_LENGTH

const digitValue = (code: number): number => {
  if (code >= 48 && code <= 57) return code - 48 // 0-9
  if (code >= 65 && code <= 90) return code - 55 // A-Z
  if (code >= 97 && code <= 122) return code - 61 // a-z
  return -1
}

const toBase62 = (value: bigint, width: number): string => {
  let out = ""
  let n = value
  while (n > 0n) {
    out = ALPHABET[Number(n % 62n)] + out
    n /= 62n
  }
  return out.padStart(width, "0")
}

const checksumOf = (body: string): string => toBase62(BigInt(crc32(body)), KEY_CHECKSUM_LENGTH)

export interface GeneratedKey {
  /** The secret, shown to its owner once. */
  readonly key: string
  /** Hex SHA-256 of `key`: what is stored. */
  readonly hash: string
  /** The first 12 characters, safe to display. */
  readonly prefix: string
}

export const generateKey = (): GeneratedKey => {
  const body = toBase62(BigInt(`0x${randomBytes(32).toString("hex")}`), KEY_BODY_LENGTH)
  const key = KEY_PREFIX + body + checksumOf(body)
  return { key, hash: hashKey(key), prefix: key.slice(0, DISPLAY_PREFIX_LENGTH) }
}

/** Prefix and length only: what may be hashed and looked up in the key cache. */
export const hasKeyShape = (key: string): boolean => key.length === KEY_LENGTH && key.startsWith(KEY_PREFIX)

/**
 * Prefix, length, alphabet and checksum. Runs before any repository lookup
 * (on a key-cache miss: the cache holds only keys that passed it), so it
 * decodes the checksum into a number instead of building strings; CRC32
 * catches every single-character change of the body.
 */
export const isWellFormed = (key: string): boolean => {
  if (!hasKeyShape(key)) return false
  for (let i = BODY_START; i < CHECKSUM_START; i++) {
    if (digitValue(key.charCodeAt(i)) < 0) return false
  }
  let checksum = 0
  for (let i = CHECKSUM_START; i < KEY_LENGTH; i++) {
    const digit = digitValue(key.charCodeAt(i))
    if (digit < 0) return false
    // at most 62^6 ≈ 5.7e10: exact in a double
    checksum = checksum * 62 + digit
  }
  return checksum === crc32(key.slice(BODY_START, CHECKSUM_START))
}

// `crypto.hash` (Node ≥ 20.12) hashes in one call, without a Hash object: under half the cost per key.
const oneShot = (crypto as { hash?: typeof crypto.hash }).hash

export const hashKey = (key: string): string =>
  oneShot !== undefined
    ? oneShot("sha256", key, "hex")
    : createHash("sha256").update(key, "utf8").digest("hex")

/**
 * Constant-time comparison of two hashes, so response timing does not reveal
 * how many leading characters of a guess match. Compared as UTF-8 bytes, not
 * hex-decoded: hex decoding silently drops invalid characters.
 */
export const hashesEqual = (a: string, b: string): boolean => {
  const left = Buffer.from(a, "utf8")
  const right = Buffer.from(b, "utf8")
  return left.length === right.length && timingSafeEqual(left, right)
}

const bearer = /^bearer[ \t]+(\S+)$/i

/**
 * The token of an `Authorization: Bearer <token>` header; `undefined` when the
 * header is missing, uses another scheme, or has no token or several words.
 */
export const parseBearer = (header: string | undefined): string | undefined => {
  if (header === undefined) return undefined
  const match = bearer.exec(header.trim())
  return match === null ? undefined : match[1]
}
