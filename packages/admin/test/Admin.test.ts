import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { ApiKeys, Repository } from "@swarmgate/auth"
import { Database } from "@swarmgate/store"
import { Effect, Either, Layer, TestClock } from "effect"
import { type AdminResponse, handleAdmin } from "../src/Admin"
import * as AdminLayers from "./support/AdminLayers"

const NOW = Date.UTC(2026, 10, 15, 12, 0, 0)

const TestLayer = AdminLayers.outboxLayer().pipe(
  Layer.provideMerge(
    ApiKeys.layer().pipe(
      Layer.provideMerge(Repository.layer),
      Layer.provideMerge(Database.layer("sqlite::memory:")),
    ),
  ),
)

/** A fresh database per test, with the clock set to mid-November 2026. */
const run = <A, E>(effect: Effect.Effect<A, E, Layer.Layer.Success<typeof TestLayer>>) =>
  Effect.provide(Effect.zipRight(TestClock.setTime(NOW), effect), TestLayer)

const call = (method: string, path: string, body?: unknown) => {
  const [pathname, search] = path.split("?")
  return handleAdmin({
    method,
    segments: pathname!.split("/"),
    query: new URLSearchParams(search ?? ""),
    body,
  })
}

// biome-ignore lint/suspicious/noExplicitAny: responses are JSON read by field
const json = (response: AdminResponse): any => response.body

const newAccount = (body: Record<string, unknown> = {}) =>
  Effect.map(call("POST", "accounts", { name: "Acme", ...body }), (r) => {
    expect(r.status).toBe(201)
    return json(r)
  })

const newKey = (accountId: string, body: Record<string, unknown> = {}) =>
  Effect.map(call("POST", `accounts/${accountId}/keys`, body), (r) => {
    expect(r.status).toBe(201)
    return json(r)
  })

const authenticate = (key: string) =>
  Effect.flatMap(ApiKeys.ApiKeys, (keys) => Effect.either(keys.authenticate(`Bearer ${key}`)))

const expectAuthFailure = (key: string, tag: string) =>
  Effect.map(authenticate(key), (result) => {
    expect(Either.isLeft(result)).toBe(true)
    if (Either.isLeft(result)) expect(result.left._tag).toBe(tag)
  })

const expectInvalid = (response: AdminResponse, param: string | null) => {
  expect(response.status).toBe(400)
  expect(json(response)).toEqual({
    error: { message: expect.any(String), type: "invalid_request_error", code: "invalid_request", param },
  })
}

const insertUsage = (row: {
  request_id: string
  account_id: string
  key_id: string
  cost_micros: number
  created_at: number
  prompt_tokens?: number
  completion_tokens?: number
}) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`INSERT INTO usage_records ${sql.insert({
        model: "swarm-prime",
        prompt_tokens: 10,
        completion_tokens: 20,
        outcome: "completed",
        started_at: row.created_at - 500,
        ...row,
      })}`,
  )

describe("Admin accounts", () => {
  it.effect("creates an account with money in USD and every limit echoed", () =>
    run(
      Effect.gen(function* () {
        const response = yield* call("POST", "accounts", {
          name: "Acme",
          balance_usd: 12.5,
          monthly_spend_limit_usd: 100,
          limits: { rpm: 60, concurrency: 4 },
        })
        expect(response.status).toBe(201)
        const account = json(response)
        expect(account).toEqual({
          id: expect.stringMatching(/^acct_/),
          object: "account",
          name: "Acme",
          status: "active",
          payment_hold: false,
          balance_usd: 12.5,
          held_usd: 0,
          spent_month_usd: 0,
          monthly_spend_limit_usd: 100,
          limits: { concurrency: 4, queue: null, rpm: 60, rph: null, daily: null, weekly: null },
          email: null,
          email_verified: true,
          created: NOW / 1000,
          closed_at: null,
        })

        const fetched = yield* call("GET", `accounts/${account.id}`)
        expect(fetched).toEqual({ status: 200, body: account })
      }),
    ),
  )

  it.effect("defaults to a zero balance, no spend limit and no limits", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        expect(account.balance_usd).toBe(0)
        expect(account.monthly_spend_limit_usd).toBeNull()
        expect(Object.values(account.limits)).toEqual([null, null, null, null, null, null])
      }),
    ),
  )

  it.effect("lists accounts under data", () =>
    run(
      Effect.gen(function* () {
        const a = yield* newAccount({ name: "A" })
        const b = yield* newAccount({ name: "B" })
        const response = yield* call("GET", "accounts")
        expect(response.status).toBe(200)
        expect(json(response).data.map((x: { id: string }) => x.id)).toEqual([a.id, b.id])
      }),
    ),
  )

  it.effect("refuses invalid account bodies with a 400 naming the parameter", () =>
    run(
      Effect.gen(function* () {
        expectInvalid(yield* call("POST", "accounts", {}), "name")
        expectInvalid(yield* call("POST", "accounts", undefined), "name")
        expectInvalid(yield* call("POST", "accounts", { name: "" }), "name")
        expectInvalid(yield* call("POST", "accounts", { name: "x".repeat(201) }), "name")
        expectInvalid(yield* call("POST", "accounts", { name: 42 }), "name")
        expectInvalid(yield* call("POST", "accounts", { name: "A", balance_usd: -1 }), "balance_usd")
        expectInvalid(yield* call("POST", "accounts", { name: "A", balance_usd: "10" }), "balance_usd")
        expectInvalid(
          yield* call("POST", "accounts", { name: "A", balance_usd: Number.POSITIVE_INFINITY }),
          "balance_usd",
        )
        expectInvalid(yield* call("POST", "accounts", { name: "A", balance_usd: Number.NaN }), "balance_usd")
        expectInvalid(
          yield* call("POST", "accounts", { name: "A", monthly_spend_limit_usd: -5 }),
          "monthly_spend_limit_usd",
        )
        expectInvalid(yield* call("POST", "accounts", { name: "A", limits: { rpm: -1 } }), "limits.rpm")
        expectInvalid(yield* call("POST", "accounts", { name: "A", limits: { rpm: 1.5 } }), "limits.rpm")
        expectInvalid(yield* call("POST", "accounts", { name: "A", limits: { tpm: 5 } }), "limits.tpm")
        expectInvalid(yield* call("POST", "accounts", { name: "A", colour: "red" }), "colour")
        expectInvalid(yield* call("POST", "accounts", [{ name: "A" }]), null)
        expectInvalid(yield* call("POST", "accounts", null), null)
        expect(json(yield* call("GET", "accounts")).data).toEqual([])
      }),
    ),
  )

  it.effect("accepts a 200-character name", () =>
    run(
      Effect.map(newAccount({ name: "x".repeat(200) }), (account) => expect(account.name).toHaveLength(200)),
    ),
  )

  it.effect("updates status, payment hold, monthly spend limit and merges limits", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount({ monthly_spend_limit_usd: 50, limits: { rpm: 60, daily: 1000 } })
        const response = yield* call("PATCH", `accounts/${account.id}`, {
          status: "restricted",
          payment_hold: true,
          monthly_spend_limit_usd: null,
          limits: { rpm: 120, daily: null, weekly: 5000 },
        })
        expect(response.status).toBe(200)
        expect(json(response)).toMatchObject({
          status: "restricted",
          payment_hold: true,
          monthly_spend_limit_usd: null,
          limits: { concurrency: null, queue: null, rpm: 120, rph: null, daily: null, weekly: 5000 },
        })
        const untouched = yield* call("PATCH", `accounts/${account.id}`, {})
        expect(json(untouched)).toEqual(json(yield* call("GET", `accounts/${account.id}`)))
        expect(json(untouched).status).toBe("restricted")
      }),
    ),
  )

  it.effect("refuses an invalid patch", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        expectInvalid(yield* call("PATCH", `accounts/${account.id}`, { status: "closed" }), "status")
        expectInvalid(yield* call("PATCH", `accounts/${account.id}`, { payment_hold: "yes" }), "payment_hold")
        expectInvalid(yield* call("PATCH", `accounts/${account.id}`, { name: "B" }), "name")
        expectInvalid(
          yield* call("PATCH", `accounts/${account.id}`, { monthly_spend_limit_usd: -1 }),
          "monthly_spend_limit_usd",
        )
      }),
    ),
  )

  it.effect("adds credits in USD and refuses non-positive amounts", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount({ balance_usd: 1.25 })
        const response = yield* call("POST", `accounts/${account.id}/credits`, { amount_usd: 10.000001 })
        expect(response.status).toBe(200)
        expect(json(response).balance_usd).toBe(11.250001)
        expectInvalid(yield* call("POST", `accounts/${account.id}/credits`, { amount_usd: 0 }), "amount_usd")
        expectInvalid(yield* call("POST", `accounts/${account.id}/credits`, { amount_usd: -3 }), "amount_usd")
        expectInvalid(yield* call("POST", `accounts/${account.id}/credits`, {}), "amount_usd")
        expect(json(yield* call("GET", `accounts/${account.id}`)).balance_usd).toBe(11.250001)
      }),
    ),
  )

  it.effect("answers 404 not_found for a missing account on every account route", () =>
    run(
      Effect.gen(function* () {
        const notFound = {
          status: 404,
          body: {
            error: {
              message: "No account with id 'acct_missing'.",
              type: "invalid_request_error",
              code: "not_found",
              param: null,
            },
          },
        }
        expect(yield* call("GET", "accounts/acct_missing")).toEqual(notFound)
        expect(yield* call("PATCH", "accounts/acct_missing", { status: "active" })).toEqual(notFound)
        expect(yield* call("POST", "accounts/acct_missing/credits", { amount_usd: 1 })).toEqual(notFound)
        expect(yield* call("POST", "accounts/acct_missing/keys", {})).toEqual(notFound)
        expect(yield* call("GET", "accounts/acct_missing/keys")).toEqual(notFound)
        expect(yield* call("GET", "usage?account_id=acct_missing")).toEqual(notFound)
      }),
    ),
  )
})

describe("Admin keys", () => {
  it.effect("shows the secret once, on creation, and never in reads or lists", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const created = yield* newKey(account.id, { name: "ci", spend_limit_usd: 5 })
        expect(created).toEqual({
          id: expect.stringMatching(/^key_/),
          key: expect.stringMatching(/^sk-swarm-[0-9A-Za-z]{49}$/),
          object: "api_key",
          account_id: account.id,
          prefix: created.key.slice(0, 12),
          name: "ci",
          status: "active",
          spend_limit_usd: 5,
          spent_usd: 0,
          expires_at: null,
          created: NOW / 1000,
        })
        const { key: _secret, ...withoutSecret } = created
        const fetched = yield* call("GET", `keys/${created.id}`)
        expect(fetched).toEqual({ status: 200, body: withoutSecret })
        const listed = yield* call("GET", `accounts/${account.id}/keys`)
        expect(json(listed)).toEqual({ data: [withoutSecret] })
        expect(JSON.stringify(json(listed))).not.toContain(created.key)
        const authenticated = yield* authenticate(created.key)
        expect(Either.isRight(authenticated)).toBe(true)
      }),
    ),
  )

  it.effect("creates a key with an empty or missing body", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const response = yield* call("POST", `accounts/${account.id}/keys`)
        expect(response.status).toBe(201)
        expect(json(response)).toMatchObject({ name: null, spend_limit_usd: null, expires_at: null })
      }),
    ),
  )

  it.effect("takes expires_at as Unix seconds or ISO-8601 and reports expired keys", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const inAnHour = NOW / 1000 + 3600
        expect((yield* newKey(account.id, { expires_at: inAnHour })).expires_at).toBe(inAnHour)
        const iso = yield* newKey(account.id, { expires_at: "2026-11-15T13:00:00Z" })
        expect(iso.expires_at).toBe(inAnHour)
        expect(iso.status).toBe("active")
        const past = yield* newKey(account.id, { expires_at: "2026-01-01T00:00:00.000Z" })
        expect(past.status).toBe("expired")
        yield* expectAuthFailure(past.key, "InvalidApiKey")
        expectInvalid(
          yield* call("POST", `accounts/${account.id}/keys`, { expires_at: "tomorrow" }),
          "expires_at",
        )
        expectInvalid(yield* call("POST", `accounts/${account.id}/keys`, { expires_at: 1.5 }), "expires_at")
        expectInvalid(yield* call("POST", `accounts/${account.id}/keys`, { expires_at: -1 }), "expires_at")
        expectInvalid(
          yield* call("POST", `accounts/${account.id}/keys`, { spend_limit_usd: -1 }),
          "spend_limit_usd",
        )
        expectInvalid(yield* call("POST", `accounts/${account.id}/keys`, { name: "k".repeat(201) }), "name")
        expectInvalid(yield* call("POST", `accounts/${account.id}/keys`, { scope: "all" }), "scope")
      }),
    ),
  )

  it.effect("disabling a key refuses it on the next request; enabling restores it", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const key = yield* newKey(account.id)
        expect(Either.isRight(yield* authenticate(key.key))).toBe(true)
        const disabled = yield* call("PATCH", `keys/${key.id}`, { disabled: true, spend_limit_usd: 2.5 })
        expect(json(disabled)).toMatchObject({ status: "disabled", spend_limit_usd: 2.5 })
        yield* expectAuthFailure(key.key, "InvalidApiKey")
        const enabled = yield* call("PATCH", `keys/${key.id}`, { disabled: false, spend_limit_usd: null })
        expect(json(enabled)).toMatchObject({ status: "active", spend_limit_usd: null })
        expect(Either.isRight(yield* authenticate(key.key))).toBe(true)
        expectInvalid(yield* call("PATCH", `keys/${key.id}`, { disabled: "no" }), "disabled")
        expectInvalid(yield* call("PATCH", `keys/${key.id}`, { revoked: true }), "revoked")
      }),
    ),
  )

  it.effect("revocation takes effect on the next request and is final", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const key = yield* newKey(account.id)
        expect(Either.isRight(yield* authenticate(key.key))).toBe(true)
        const revoked = yield* call("POST", `keys/${key.id}/revoke`)
        expect(revoked.status).toBe(200)
        expect(json(revoked).status).toBe("revoked")
        expect(json(revoked).key).toBeUndefined()
        yield* expectAuthFailure(key.key, "InvalidApiKey")
        const reenabled = yield* call("PATCH", `keys/${key.id}`, { disabled: false })
        expect(json(reenabled).status).toBe("revoked")
        expect(json(yield* call("POST", `keys/${key.id}/revoke`)).status).toBe("revoked")
        yield* expectAuthFailure(key.key, "InvalidApiKey")
      }),
    ),
  )

  it.effect("suspending or restricting an account refuses its keys on the next request", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const key = yield* newKey(account.id)
        expect(Either.isRight(yield* authenticate(key.key))).toBe(true)
        yield* call("PATCH", `accounts/${account.id}`, { status: "suspended" })
        yield* expectAuthFailure(key.key, "AccountSuspended")
        yield* call("PATCH", `accounts/${account.id}`, { status: "restricted" })
        yield* expectAuthFailure(key.key, "AccountRestricted")
        yield* call("PATCH", `accounts/${account.id}`, { status: "active" })
        expect(Either.isRight(yield* authenticate(key.key))).toBe(true)
      }),
    ),
  )

  it.effect("answers 404 not_found for a missing key", () =>
    run(
      Effect.gen(function* () {
        for (const [method, path] of [
          ["GET", "keys/key_missing"],
          ["PATCH", "keys/key_missing"],
          ["POST", "keys/key_missing/revoke"],
        ] as const) {
          const response = yield* call(method, path, method === "PATCH" ? { disabled: true } : undefined)
          expect(response.status).toBe(404)
          expect(json(response).error).toMatchObject({ code: "not_found", type: "invalid_request_error" })
        }
      }),
    ),
  )
})

describe("Admin usage", () => {
  it.effect("lists usage newest first, filters by key, limits, and sums spend", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        const other = yield* newAccount({ name: "Other" })
        const k1 = yield* newKey(account.id)
        const k2 = yield* newKey(account.id)
        const k3 = yield* newKey(other.id)
        const lastMonth = Date.UTC(2026, 9, 31, 23, 59, 59)
        yield* insertUsage({
          request_id: "req_1",
          account_id: account.id,
          key_id: k1.id,
          cost_micros: 1_500_000,
          created_at: lastMonth,
        })
        yield* insertUsage({
          request_id: "req_2",
          account_id: account.id,
          key_id: k1.id,
          cost_micros: 250_000,
          created_at: NOW - 2000,
        })
        yield* insertUsage({
          request_id: "req_3",
          account_id: account.id,
          key_id: k2.id,
          cost_micros: 10,
          created_at: NOW - 1000,
          prompt_tokens: 7,
          completion_tokens: 3,
        })
        yield* insertUsage({
          request_id: "req_4",
          account_id: other.id,
          key_id: k3.id,
          cost_micros: 999,
          created_at: NOW,
        })

        const all = json(yield* call("GET", `usage?account_id=${account.id}`))
        expect(all.data.map((r: { request_id: string }) => r.request_id)).toEqual(["req_3", "req_2", "req_1"])
        expect(all.data[0]).toEqual({
          request_id: "req_3",
          key_id: k2.id,
          model: "swarm-prime",
          prompt_tokens: 7,
          completion_tokens: 3,
          cost_usd: 0.00001,
          outcome: "completed",
          created: (NOW - 1000) / 1000,
        })
        const byKey = json(yield* call("GET", `usage?account_id=${account.id}&key_id=${k1.id}`))
        expect(byKey.data.map((r: { request_id: string }) => r.request_id)).toEqual(["req_2", "req_1"])
        const limited = json(yield* call("GET", `usage?account_id=${account.id}&limit=1`))
        expect(limited.data.map((r: { request_id: string }) => r.request_id)).toEqual(["req_3"])

        // Only this calendar month (UTC) counts towards spent_month_usd; keys sum all time.
        expect(json(yield* call("GET", `accounts/${account.id}`)).spent_month_usd).toBe(0.25001)
        expect(json(yield* call("GET", `keys/${k1.id}`)).spent_usd).toBe(1.75)
        const listed = json(yield* call("GET", `accounts/${account.id}/keys`))
        expect(listed.data.map((k: { spent_usd: number }) => k.spent_usd)).toEqual([1.75, 0.00001])
        const accounts = json(yield* call("GET", "accounts"))
        expect(accounts.data.map((a: { spent_month_usd: number }) => a.spent_month_usd)).toEqual([
          0.25001, 0.000999,
        ])
      }),
    ),
  )

  it.effect("validates the usage query", () =>
    run(
      Effect.gen(function* () {
        const account = yield* newAccount()
        expectInvalid(yield* call("GET", "usage"), "account_id")
        expectInvalid(yield* call("GET", `usage?account_id=${account.id}&limit=1001`), "limit")
        expectInvalid(yield* call("GET", `usage?account_id=${account.id}&limit=0`), "limit")
        expectInvalid(yield* call("GET", `usage?account_id=${account.id}&limit=ten`), "limit")
        const max = yield* call("GET", `usage?account_id=${account.id}&limit=1000`)
        expect(max).toEqual({ status: 200, body: { data: [] } })
      }),
    ),
  )
})

describe("Admin routing", () => {
  it.effect("answers unknown paths with 404 and an empty body", () =>
    run(
      Effect.gen(function* () {
        for (const path of [
          "",
          "nodes",
          "accounts/a/b/c",
          "accounts/a/debits",
          "keys",
          "keys/k/unrevoke",
          "usage/x",
          "accounts/",
        ]) {
          expect(yield* call("GET", path)).toEqual({ status: 404, body: undefined })
        }
      }),
    ),
  )

  it.effect("answers a wrong method on a known path with 405 and an empty body", () =>
    run(
      Effect.gen(function* () {
        for (const [method, path] of [
          ["DELETE", "accounts"],
          ["PUT", "accounts/acct_x"],
          ["GET", "accounts/acct_x/credits"],
          ["DELETE", "accounts/acct_x/keys"],
          ["POST", "keys/key_x"],
          ["GET", "keys/key_x/revoke"],
          ["POST", "usage"],
        ] as const) {
          expect(yield* call(method, path, {})).toEqual({ status: 405, body: undefined })
        }
      }),
    ),
  )

  it.effect("accepts methods in any case", () =>
    run(Effect.map(call("get", "accounts"), (response) => expect(response.status).toBe(200))),
  )

  it.effect("answers 503 admission_unavailable when the store fails", () =>
    Effect.gen(function* () {
      const failing = Layer.effect(
        Repository.Repository,
        Effect.map(Repository.make, (repo) => ({
          ...repo,
          listAccounts: () => Effect.fail(new Repository.RepositoryUnavailable({ cause: "disk on fire" })),
        })),
      )
      const layer = AdminLayers.outboxLayer().pipe(
        Layer.provideMerge(ApiKeys.layer().pipe(Layer.provideMerge(failing))),
        Layer.provideMerge(Database.layer("sqlite::memory:")),
      )
      const response = yield* Effect.provide(call("GET", "accounts"), layer)
      expect(response.status).toBe(503)
      expect(json(response)).toEqual({
        error: {
          message: expect.any(String),
          type: "server_error",
          code: "admission_unavailable",
          param: null,
        },
      })
    }),
  )
})
