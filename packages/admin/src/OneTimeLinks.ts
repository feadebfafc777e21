/**
 * The tokens in mailed links: verify an application, claim a key, verify a
 * new address. Each is random, stored as a SHA-256 hash only, single use and
 * expiring. A claim token also unseals the key it shows: the key is stored
 * encrypted under the token (AES-256-GCM), which only the mail holds, so the
 * database alone never reveals a key.
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Clock, Data, Effect } from "effect"

export type Purpose = "apply_verify" | "claim" | "email_verify"

const HOUR = 3_600_000
export const TTL_MILLIS: Readonly<Record<Purpose, number>> = {
  apply_verify: 24 * HOUR,
  claim: 7 * 24 * HOUR,
  email_verify: 24 * HOUR,
}

/** Longer input is no token of ours; refused without a lookup. */
const MAX_TOKEN_LENGTH = 128

export class LinkRefused extends Data.TaggedError("LinkRefused")<{
  readonly reason: "unknown" | "used" | "expired"
}> {}

const hashOf = (token: string) => createHash("sha256").update(`link:${token}`).digest("hex")
const sealKey = (token: string) => createHash("sha256").update(`seal:${token}`).digest()

export const seal = (secret: string, token: string): string => {
  const iv = randomBytes(12)
  const cipher = createCipheriv("aes-256-gcm", sealKey(token), iv)
  const body = Buffer.concat([cipher.update(secret, "utf8"), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64")
}

export const unseal = (sealed: string, token: string): string => {
  const raw = Buffer.from(sealed, "base64")
  const decipher = createDecipheriv("aes-256-gcm", sealKey(token), raw.subarray(0, 12))
  decipher.setAuthTag(raw.subarray(12, 28))
  return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8")
}

/**
 * A new token for `subjectId`; earlier unused tokens of the same purpose for
 * it stop working. `secret` is sealed under the token (claims).
 */
export const issue = (purpose: Purpose, subjectId: string, secret?: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const token = randomBytes(32).toString("base64url")
    yield* sql`UPDATE access_tokens SET used_at = ${now}, sealed = NULL
      WHERE subject_id = ${subjectId} AND purpose = ${purpose} AND used_at IS NULL`
    yield* sql`INSERT INTO access_tokens ${sql.insert({
      token_hash: hashOf(token),
      purpose,
      subject_id: subjectId,
      sealed: secret === undefined ? null : seal(secret, token),
      expires_at: now + TTL_MILLIS[purpose],
      used_at: null,
      created_at: now,
    })}`
    return token
  })

interface TokenRow {
  readonly subject_id: string
  readonly sealed: string | null
  readonly expires_at: number | string
  readonly used_at: number | string | null
}

/**
 * Uses the token once: its subject (and unsealed secret), or why not. Of two
 * concurrent uses exactly one wins; the other sees `used`.
 */
export const consume = (purpose: Purpose, token: string) =>
  Effect.gen(function* () {
    if (token.length === 0 || token.length > MAX_TOKEN_LENGTH)
      return yield* Effect.fail(new LinkRefused({ reason: "unknown" }))
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const hash = hashOf(token)
    const rows = yield* sql<TokenRow>`SELECT subject_id, sealed, expires_at, used_at FROM access_tokens
      WHERE token_hash = ${hash} AND purpose = ${purpose}`
    const row = rows[0]
    if (row === undefined) return yield* Effect.fail(new LinkRefused({ reason: "unknown" }))
    if (row.used_at !== null) return yield* Effect.fail(new LinkRefused({ reason: "used" }))
    if (Database.toNumber(row.expires_at) <= now)
      return yield* Effect.fail(new LinkRefused({ reason: "expired" }))
    const won = yield* sql<{ token_hash: string }>`UPDATE access_tokens SET used_at = ${now}, sealed = NULL
      WHERE token_hash = ${hash} AND used_at IS NULL RETURNING token_hash`
    if (won.length === 0) return yield* Effect.fail(new LinkRefused({ reason: "used" }))
    return {
      subjectId: row.subject_id,
      secret: row.sealed === null ? undefined : unseal(row.sealed, token),
    }
  })

/** Stops every unused token of `purpose` for `subjectId` (e.g. an address changed again). */
export const withdraw = (purpose: Purpose, subjectId: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    yield* sql`UPDATE access_tokens SET used_at = ${now}, sealed = NULL
      WHERE subject_id = ${subjectId} AND purpose = ${purpose} AND used_at IS NULL`
  })
