/**
 * The console's sign-in: the admin token once, then a session cookie
 * (HttpOnly, SameSite=Strict, Path=/console, Secure behind https). Sessions
 * live in SQL as hashes, shared by every instance; each carries the CSRF
 * token that every change must send back in its form.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto"
import type { IncomingMessage } from "node:http"
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Clock, Effect } from "effect"

export const COOKIE = "swarmgate_console"
export const SESSION_MILLIS = 12 * 3_600_000

export interface Session {
  readonly hash: string
  readonly csrf: string
}

const hashOf = (id: string) => createHash("sha256").update(`console:${id}`).digest("hex")

/** Equal strings, compared in constant time (over fixed-length digests). */
export const sameSecret = (a: string, b: string) => {
  const x = createHash("sha256").update(a).digest()
  const y = createHash("sha256").update(b).digest()
  return timingSafeEqual(x, y)
}

export const cookieOf = (req: IncomingMessage): string | undefined => {
  const header = req.headers.cookie
  if (header === undefined) return undefined
  for (const part of header.split(";")) {
    const eq = part.indexOf("=")
    if (eq > 0 && part.slice(0, eq).trim() === COOKIE) return part.slice(eq + 1).trim()
  }
  return undefined
}

/** Whether the browser reached us over https (directly or through a proxy on this machine saying so). */
export const isHttps = (req: IncomingMessage, publicUrl: string) =>
  publicUrl.startsWith("https:") ||
  ("encrypted" in req.socket && Boolean((req.socket as { encrypted?: boolean }).encrypted)) ||
  req.headers["x-forwarded-proto"] === "https"

export const setCookie = (id: string, secure: boolean) =>
  `${COOKIE}=${id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age=${SESSION_MILLIS / 1000}${secure ? "; Secure" : ""}`

export const clearCookie = (secure: boolean) =>
  `${COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0${secure ? "; Secure" : ""}`

/** A new session; the returned id goes into the cookie and nowhere else. */
export const open = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const now = yield* Clock.currentTimeMillis
  const id = randomBytes(32).toString("base64url")
  const csrf = randomBytes(32).toString("base64url")
  yield* sql`DELETE FROM console_sessions WHERE expires_at <= ${now}`
  yield* sql`INSERT INTO console_sessions ${sql.insert({
    session_hash: hashOf(id),
    csrf_token: csrf,
    expires_at: now + SESSION_MILLIS,
    created_at: now,
  })}`
  return id
})

/** The session of the request's cookie, if it is live. */
export const find = (req: IncomingMessage) =>
  Effect.gen(function* () {
    const id = cookieOf(req)
    if (id === undefined || id.length === 0 || id.length > 128) return undefined
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const hash = hashOf(id)
    const rows = yield* sql<{ csrf_token: string; expires_at: number | string }>`
      SELECT csrf_token, expires_at FROM console_sessions WHERE session_hash = ${hash}`
    const row = rows[0]
    if (row === undefined || Database.toNumber(row.expires_at) <= now) return undefined
    return { hash, csrf: row.csrf_token } satisfies Session
  })

export const close = (session: Session) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`DELETE FROM console_sessions WHERE session_hash = ${session.hash}`,
  )
