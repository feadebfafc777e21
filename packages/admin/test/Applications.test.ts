/**
 * Applications, mailed links and the account lifecycle against the real SQL
 * (SQLite and PostgreSQL): single-use, expiring tokens (TestClock), answers
 * that tell a stranger nothing new, the per-client bound, approval races,
 * and closing while a request runs.
 */
import type { ServerResponse } from "node:http"
import { SqlClient } from "@effect/sql"
import { describe, expect, layer, it as vitestIt } from "@effect/vitest"
import { ApiKeys, type Principal, Repository } from "@swarmgate/auth"
import { Dispatcher, Presets } from "@swarmgate/dispatch"
import { Limits } from "@swarmgate/gateway"
import { Database, TestDatabase } from "@swarmgate/store"
import { Effect, Either, Exit, Layer, Scope, TestClock } from "effect"
import * as AccountLifecycle from "../src/AccountLifecycle"
import { handleAdmin } from "../src/Admin"
import * as Applications from "../src/Applications"
import * as Mail from "../src/Mail"
import * as OneTimeLinks from "../src/OneTimeLinks"
import * as AdminLayers from "./support/AdminLayers"

const PER_HOUR = 3
const PRESETS = Presets.defaultPresets()
const DispatcherNoNodes = Layer.sync(Dispatcher.Dispatcher, () => Dispatcher.make(PRESETS, []))

const servicesOn = (database: Layer.Layer<SqlClient.SqlClient, unknown>) =>
  Layer.mergeAll(
    AdminLayers.outboxLayer({ applyPerHour: PER_HOUR }),
    Limits.layer().pipe(Layer.provide(DispatcherNoNodes)),
  ).pipe(
    Layer.provideMerge(ApiKeys.layer()),
    Layer.provideMerge(Repository.layer),
    Layer.provideMerge(database),
  )

const form = (email: string, extra: Record<string, unknown> = {}) => ({
  name: "Ada Lovelace",
  email,
  use_case: "Analytical engines",
  ...extra,
})

/** The token of the newest mail to `to` whose link starts with `path`. */
const tokenFor = (to: string, path: string) =>
  Effect.gen(function* () {
    const mails = yield* (yield* Mail.Mailer).outbox
    const mail = mails.find((m) => m.to === to && m.text.includes(`${AdminLayers.PUBLIC_URL}${path}?token=`))
    if (mail === undefined) throw new Error(`no mail to ${to} with ${path}`)
    const url = mail.text.match(/https?:\/\/\S+/g)!.find((u) => u.includes(path))!
    return new URL(url).searchParams.get("token")!
  })

const mailsTo = (to: string) =>
  Effect.map(
    Effect.flatMap(Mail.Mailer, (m) => m.outbox),
    (all) => all.filter((m) => m.to === to),
  )

const rowCount = (table: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ n: number | string }>`SELECT COUNT(*) AS n FROM ${sql(table)}`,
  ).pipe(Effect.map((rows) => Number(rows[0]!.n)))

const refusal = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.map(Effect.either(effect), (result) => (Either.isLeft(result) ? result.left : undefined))

const admin = (method: string, path: string, body?: unknown) =>
  handleAdmin({
    method,
    segments: path.split("?")[0]!.split("/"),
    query: new URLSearchParams(path.split("?")[1] ?? ""),
    body,
  })

const pendingReview = (email: string, client = "10.0.0.1") =>
  Effect.gen(function* () {
    const receipt = yield* Applications.apply(form(email), client)
    yield* Applications.verify(yield* tokenFor(email, "/apply/verify"))
    return receipt.id
  })

const suite = (name: string, database: Layer.Layer<SqlClient.SqlClient, unknown>) =>
  layer(servicesOn(database), { timeout: "120 seconds" })(name, (it) => {
    it.effect("bad input is a 422 with a detail per field, and changes nothing", () =>
      Effect.gen(function* () {
        const before = yield* Effect.all([
          rowCount("applications"),
          rowCount("apply_attempts"),
          rowCount("mail_outbox"),
        ])
        const error = yield* refusal(
          Applications.apply({ name: "", email: "not-an-address", extra: 1 }, "10.9.9.9"),
        )
        expect(error?._tag).toBe("ValidationFailed")
        if (error?._tag !== "ValidationFailed") return
        expect(error.detail).toEqual(
          expect.arrayContaining([
            { loc: ["body", "name"], msg: "must not be empty", type: "value_error" },
            { loc: ["body", "email"], msg: expect.stringContaining("email address"), type: "value_error" },
            { loc: ["body", "use_case"], msg: "Field required", type: "missing" },
            { loc: ["body", "extra"], msg: "Extra inputs are not permitted", type: "extra_forbidden" },
          ]),
        )
        const after = yield* Effect.all([
          rowCount("applications"),
          rowCount("apply_attempts"),
          rowCount("mail_outbox"),
        ])
        expect(after).toEqual(before)
      }),
    )

    it.effect(
      "applying again with an open application answers the same, with a new link; the old one stops",
      () =>
        Effect.gen(function* () {
          const email = "again@example.org"
          const first = yield* Applications.apply(form(email), "10.0.1.1")
          expect(first).toEqual({
            id: expect.stringMatching(/^app_/),
            object: "application",
            status: "pending_verification",
          })
          const oldToken = yield* tokenFor(email, "/apply/verify")
          yield* TestClock.adjust("1 second")
          const second = yield* Applications.apply(
            form(" AGAIN@example.org ", { name: "Someone Else" }),
            "10.0.1.2",
          )
          expect(second).toEqual(first)
          expect(yield* mailsTo(email)).toHaveLength(2)
          const newToken = yield* tokenFor(email, "/apply/verify")
          expect(newToken).not.toBe(oldToken)
          expect((yield* refusal(Applications.verify(oldToken)))?._tag).toBe("LinkRefused")
          const verified = yield* Applications.verify(newToken)
          expect(verified.status).toBe("pending_review")
          // Under review: the same answer, and no new mail.
          const third = yield* Applications.apply(form(email), "10.0.1.3")
          expect(third).toEqual({ ...first, status: "pending_review" })
          expect(yield* mailsTo(email)).toHaveLength(2)
          // The stored application kept the first applicant's details.
          expect((yield* Applications.get(first.id)).name).toBe("Ada Lovelace")
        }),
    )

    it.effect("a verification link is single use and expires after 24 hours", () =>
      Effect.gen(function* () {
        yield* Applications.apply(form("once@example.org"), "10.0.2.1")
        const token = yield* tokenFor("once@example.org", "/apply/verify")
        yield* Applications.verify(token)
        expect(yield* refusal(Applications.verify(token))).toMatchObject({
          _tag: "LinkRefused",
          reason: "used",
        })

        const late = yield* Applications.apply(form("late@example.org"), "10.0.2.2")
        const lateToken = yield* tokenFor("late@example.org", "/apply/verify")
        yield* TestClock.adjust("24 hours")
        expect(yield* refusal(Applications.verify(lateToken))).toMatchObject({
          _tag: "LinkRefused",
          reason: "expired",
        })
        expect((yield* Applications.get(late.id)).status).toBe("pending_verification")
        expect(yield* refusal(Applications.verify("made-up"))).toMatchObject({
          _tag: "LinkRefused",
          reason: "unknown",
        })
        expect(yield* refusal(Applications.verify("x".repeat(10_000)))).toMatchObject({ reason: "unknown" })
      }),
    )

    it.effect(
      "one client gets its hourly number of applications, then 429 with Retry-After, then more an hour later",
      () =>
        Effect.gen(function* () {
          const client = "192.0.2.77"
          for (let i = 0; i < PER_HOUR; i++) yield* Applications.apply(form(`bound${i}@example.org`), client)
          yield* TestClock.adjust("10 minutes")
          const refused = yield* refusal(Applications.apply(form("bound-x@example.org"), client))
          expect(refused).toMatchObject({ _tag: "RateLimitExceeded", status: 429 })
          expect(refused?._tag === "RateLimitExceeded" && refused.retryAfter).toBe(50 * 60)
          expect(yield* mailsTo("bound-x@example.org")).toHaveLength(0)
          // Another client is not affected.
          yield* Applications.apply(form("other@example.org"), "192.0.2.78")
          yield* TestClock.adjust("50 minutes")
          yield* Applications.apply(form("bound-x@example.org"), client)
        }),
    )

    it.effect("two approvals at once: exactly one account; the other is 409", () =>
      Effect.gen(function* () {
        const id = yield* pendingReview("race@example.org")
        const accountsBefore = yield* rowCount("accounts")
        const [a, b] = yield* Effect.all(
          [
            admin("POST", `applications/${id}/approve`, { balance_usd: 3 }),
            admin("POST", `applications/${id}/approve`, { balance_usd: 3 }),
          ],
          {
            concurrency: 2,
          },
        )
        expect([a.status, b.status].sort()).toEqual([200, 409])
        expect(yield* rowCount("accounts")).toBe(accountsBefore + 1)
        const application = yield* Applications.get(id)
        expect(application).toMatchObject({ status: "approved", account_id: expect.stringMatching(/^acct_/) })
        expect(application.decided_at).not.toBeNull()
        const account = yield* (yield* Repository.Repository).getAccount(application.account_id!)
        expect(account).toMatchObject({
          email: "race@example.org",
          emailVerified: true,
          balanceMicros: 3_000_000,
        })
      }),
    )

    it.effect("the claim link shows a working key once; the key is stored only as a hash", () =>
      Effect.gen(function* () {
        const id = yield* pendingReview("claim@example.org")
        yield* admin("POST", `applications/${id}/approve`, {})
        const token = yield* tokenFor("claim@example.org", "/apply/claim")
        const sql = yield* SqlClient.SqlClient
        const stored = yield* sql<{
          sealed: string
        }>`SELECT sealed FROM access_tokens WHERE purpose = 'claim' AND used_at IS NULL`
        const claimed = yield* Applications.claim(token)
        expect(claimed.key).toMatch(/^sk-/)
        for (const row of stored) expect(row.sealed).not.toContain(claimed.key)
        const principal = yield* (yield* ApiKeys.ApiKeys).authenticate(`Bearer ${claimed.key}`)
        expect(principal.account.id).toBe(claimed.application.account_id)
        expect(yield* refusal(Applications.claim(token))).toMatchObject({
          _tag: "LinkRefused",
          reason: "used",
        })
      }),
    )

    it.effect("a claim link expires after 7 days", () =>
      Effect.gen(function* () {
        const id = yield* pendingReview("slow@example.org")
        yield* admin("POST", `applications/${id}/approve`, {})
        const token = yield* tokenFor("slow@example.org", "/apply/claim")
        yield* TestClock.adjust("7 days")
        expect(yield* refusal(Applications.claim(token))).toMatchObject({
          _tag: "LinkRefused",
          reason: "expired",
        })
      }),
    )

    it.effect(
      "reject mails the reason; a decided application cannot be decided again; lists filter by status",
      () =>
        Effect.gen(function* () {
          const id = yield* pendingReview("no@example.org")
          expect((yield* admin("POST", `applications/${id}/reject`, {})).status).toBe(400)
          const rejected = yield* admin("POST", `applications/${id}/reject`, {
            reason: "Not a fit for the Preview",
          })
          expect(rejected).toMatchObject({
            status: 200,
            body: { status: "rejected", reason: "Not a fit for the Preview" },
          })
          const mail = (yield* mailsTo("no@example.org")).find((m) => m.subject.includes("application"))
          expect(mail?.text).toContain("Not a fit for the Preview")
          expect((yield* admin("POST", `applications/${id}/approve`, {})).status).toBe(409)
          expect((yield* admin("POST", `applications/${id}/reject`, { reason: "again" })).status).toBe(409)
          const list = (yield* admin("GET", "applications?status=rejected")).body as {
            data: Array<{ id: string; status: string }>
          }
          expect(list.data.map((a) => a.id)).toContain(id)
          expect(list.data.every((a) => a.status === "rejected")).toBe(true)
          expect((yield* admin("GET", "applications?status=bogus")).status).toBe(400)
          expect((yield* admin("GET", "applications/app_missing")).status).toBe(404)
          expect((yield* admin("POST", "applications/app_missing/approve", {})).status).toBe(404)
        }),
    )

    it.effect(
      "a new address is unverified until its link is followed: new requests get account_restricted",
      () =>
        Effect.gen(function* () {
          const repo = yield* Repository.Repository
          const account = yield* repo.createAccount({ name: "Mover", email: "old@example.org" })
          const { secret } = yield* repo.createKey(account.id, {})
          const keys = yield* ApiKeys.ApiKeys
          yield* keys.authenticate(`Bearer ${secret}`)
          const patched = yield* admin("PATCH", `accounts/${account.id}`, { email: "New@Example.org" })
          expect(patched.body).toMatchObject({ email: "new@example.org", email_verified: false })
          expect(yield* refusal(keys.authenticate(`Bearer ${secret}`))).toMatchObject({
            _tag: "AccountRestricted",
          })
          // A request already running is not stopped by the change.
          yield* keys.authenticate(`Bearer ${secret}`, true)
          expect((yield* admin("PATCH", `accounts/${account.id}`, { email: "bad address" })).status).toBe(400)
          yield* AccountLifecycle.verifyEmail(yield* tokenFor("new@example.org", "/account/verify"))
          yield* keys.authenticate(`Bearer ${secret}`)
          expect((yield* repo.getAccount(account.id)).emailVerified).toBe(true)
        }),
    )

    it.effect(
      "closing: new requests refused at once, running ones finish; then closed, keys revoked, statement mailed",
      () =>
        Effect.gen(function* () {
          const repo = yield* Repository.Repository
          const account = yield* repo.createAccount({
            name: "Leaver",
            email: "leaver@example.org",
            balanceMicros: 2_000_000,
          })
          const { secret } = yield* repo.createKey(account.id, {})
          const keys = yield* ApiKeys.ApiKeys
          // A request running for the account holds a concurrency slot.
          const running = yield* Scope.make()
          const permit = yield* Scope.extend(
            Limits.admit(
              {
                headersSent: false,
                setHeader: () => undefined,
                removeHeader: () => undefined,
              } as unknown as ServerResponse,
              { account, key: (yield* keys.authenticate(`Bearer ${secret}`)).key } satisfies Principal,
              "swarm-swift",
              { started: false } as never,
            ),
            running,
          )
          yield* permit.commit
          const closing = yield* admin("POST", `accounts/${account.id}/close`)
          expect(closing.body).toMatchObject({ status: "closing" })
          expect(yield* refusal(keys.authenticate(`Bearer ${secret}`))).toMatchObject({
            _tag: "AccountRestricted",
          })
          yield* keys.authenticate(`Bearer ${secret}`, true)
          expect((yield* admin("PATCH", `accounts/${account.id}`, { status: "active" })).status).toBe(409)
          expect((yield* admin("POST", `accounts/${account.id}/keys`, {})).status).toBe(409)

          expect(yield* AccountLifecycle.finish(yield* repo.getAccount(account.id))).toBe(false)
          yield* Scope.close(running, Exit.void)
          yield* AccountLifecycle.closeIdleAccounts
          const closed = yield* repo.getAccount(account.id)
          expect(closed.status).toBe("closed")
          expect(yield* refusal(keys.authenticate(`Bearer ${secret}`))).toMatchObject({
            _tag: "InvalidApiKey",
          })
          const statement = (yield* admin("GET", `accounts/${account.id}/statement`)).body
          expect(statement).toEqual({
            account_id: account.id,
            credits_usd: 2,
            charges_usd: 0,
            refunds_usd: 0,
            balance_usd: 2,
            closed_at: expect.any(Number),
          })
          expect((yield* mailsTo("leaver@example.org")).map((m) => m.subject)).toContain(
            "Your swarmgate account is closed",
          )
          // Final: no reopening, no credit, and a second close changes nothing.
          expect((yield* admin("PATCH", `accounts/${account.id}`, { status: "active" })).status).toBe(409)
          expect((yield* admin("POST", `accounts/${account.id}/credits`, { amount_usd: 1 })).status).toBe(409)
          expect((yield* admin("POST", `accounts/${account.id}/close`)).body).toMatchObject({
            status: "closed",
          })
          expect(
            (yield* mailsTo("leaver@example.org")).filter((m) => m.subject.includes("closed")),
          ).toHaveLength(1)
        }),
    )

    it.effect("the outbox keeps the newest 200 mails", () =>
      Effect.gen(function* () {
        const mailer = yield* Mail.Mailer
        for (let i = 0; i < Mail.OUTBOX_SIZE + 5; i++) {
          yield* TestClock.adjust("1 millis")
          yield* mailer.send({ to: `bulk${i}@example.org`, subject: "bulk", text: "x" })
        }
        const kept = yield* mailer.outbox
        expect(kept.length).toBeLessThanOrEqual(Mail.OUTBOX_SIZE)
        expect(kept[0]!.to).toBe(`bulk${Mail.OUTBOX_SIZE + 4}@example.org`)
        expect(kept.some((m) => m.to === "bulk0@example.org")).toBe(false)
      }),
    )
  })

suite("applications on SQLite", Database.layer("sqlite::memory:"))
TestDatabase.describePg(describe, "applications on PostgreSQL", () => {
  suite("a fresh database", TestDatabase.layerPg("swarmgate_applications"))
})

describe("one-time links", () => {
  vitestIt.effect("seal and unseal round-trip only with the token", () =>
    Effect.sync(() => {
      const sealed = OneTimeLinks.seal("sk-secret", "token-a")
      expect(OneTimeLinks.unseal(sealed, "token-a")).toBe("sk-secret")
      expect(() => OneTimeLinks.unseal(sealed, "token-b")).toThrow()
    }),
  )
})
