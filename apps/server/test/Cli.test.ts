import { afterEach, beforeEach, describe, expect, it } from "@effect/vitest"
import { AdminConfig, Mail } from "@swarmgate/admin"
import { ApiKeys, Repository } from "@swarmgate/auth"
import { Database } from "@swarmgate/store"
import { Effect, Either, Exit, Layer, TestClock } from "effect"
import { type MockInstance, vi } from "vitest"
import { runCli } from "../src/Cli"

const NOW = Date.UTC(2026, 10, 15, 12, 0, 0)

const TestLayer = Mail.layer.pipe(
  Layer.provideMerge(AdminConfig.layer(AdminConfig.defaults("http://swarmgate.test"))),
  Layer.provideMerge(ApiKeys.layer()),
  Layer.provideMerge(Repository.layer),
  Layer.provideMerge(Database.layer("sqlite::memory:")),
)

const run = <A, E>(effect: Effect.Effect<A, E, Layer.Layer.Success<typeof TestLayer>>) =>
  Effect.provide(Effect.zipRight(TestClock.setTime(NOW), effect), TestLayer)

let log: MockInstance<typeof console.log>
let error: MockInstance<typeof console.error>

beforeEach(() => {
  log = vi.spyOn(console, "log").mockImplementation(() => {})
  error = vi.spyOn(console, "error").mockImplementation(() => {})
})

afterEach(() => {
  vi.restoreAllMocks()
})

// biome-ignore lint/suspicious/noExplicitAny: printed JSON is read by field
type Json = any

/** Runs a command that must succeed and returns the JSON it printed. */
const cli = (...argv: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    log.mockClear()
    yield* runCli(argv)
    expect(log).toHaveBeenCalledTimes(1)
    return JSON.parse(String(log.mock.calls[0]![0])) as Json
  })

/** Runs a command that must fail and returns the error object it printed on stderr. */
const cliError = (...argv: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    log.mockClear()
    error.mockClear()
    const exit = yield* Effect.exit(runCli(argv))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(log).not.toHaveBeenCalled()
    expect(error).toHaveBeenCalledTimes(1)
    return (JSON.parse(String(error.mock.calls[0]![0])) as Json).error
  })

describe("swarmgate CLI", () => {
  it.effect("creates, reads, lists, updates and credits accounts", () =>
    run(
      Effect.gen(function* () {
        const account = yield* cli(
          "accounts",
          "create",
          "--name",
          "Acme Ltd",
          "--balance-usd",
          "12.5",
          "--monthly-spend-limit-usd",
          "100",
          "--rpm",
          "60",
          "--concurrency",
          "4",
        )
        expect(account).toEqual({
          id: expect.stringMatching(/^acct_/),
          object: "account",
          name: "Acme Ltd",
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
        expect(yield* cli("accounts", "get", account.id)).toEqual(account)
        expect(yield* cli("accounts", "list")).toEqual({ data: [account] })

        const updated = yield* cli(
          "accounts",
          "update",
          account.id,
          "--status",
          "suspended",
          "--payment-hold",
          "true",
          "--monthly-spend-limit-usd",
          "none",
          "--rpm",
          "none",
          "--daily",
          "500",
        )
        expect(updated).toMatchObject({
          status: "suspended",
          payment_hold: true,
          monthly_spend_limit_usd: null,
          limits: { concurrency: 4, rpm: null, daily: 500 },
        })
        const credited = yield* cli("accounts", "credit", account.id, "--amount-usd", "7.5")
        expect(credited.balance_usd).toBe(20)
      }),
    ),
  )

  it.effect("creates keys, shows the secret only on creation, updates and revokes them", () =>
    run(
      Effect.gen(function* () {
        const account = yield* cli("accounts", "create", "--name", "Acme")
        const created = yield* cli(
          "keys",
          "create",
          "--account",
          account.id,
          "--name",
          "ci",
          "--spend-limit-usd",
          "5",
          "--expires-at",
          "2027-01-01T00:00:00Z",
        )
        expect(created).toMatchObject({
          object: "api_key",
          account_id: account.id,
          name: "ci",
          status: "active",
          spend_limit_usd: 5,
          spent_usd: 0,
          expires_at: Date.UTC(2027, 0, 1) / 1000,
        })
        expect(created.key).toMatch(/^sk-swarm-/)
        const keys = yield* ApiKeys.ApiKeys
        expect(Either.isRight(yield* Effect.either(keys.authenticate(`Bearer ${created.key}`)))).toBe(true)

        const fetched = yield* cli("keys", "get", created.id)
        expect(fetched.key).toBeUndefined()
        expect(fetched.id).toBe(created.id)
        const listed = yield* cli("keys", "list", "--account", account.id)
        expect(listed.data).toEqual([fetched])

        const unix = yield* cli("keys", "create", "--account", account.id, "--expires-at", "1800000000")
        expect(unix.expires_at).toBe(1_800_000_000)

        const disabled = yield* cli(
          "keys",
          "update",
          created.id,
          "--disabled",
          "true",
          "--spend-limit-usd",
          "none",
        )
        expect(disabled).toMatchObject({ status: "disabled", spend_limit_usd: null })
        expect(yield* cli("keys", "update", created.id, "--disabled", "false")).toMatchObject({
          status: "active",
        })
        expect(yield* cli("keys", "revoke", created.id)).toMatchObject({ status: "revoked" })
        expect(Either.isLeft(yield* Effect.either(keys.authenticate(`Bearer ${created.key}`)))).toBe(true)
      }),
    ),
  )

  it.effect("lists usage records of an account", () =>
    run(
      Effect.gen(function* () {
        const account = yield* cli("accounts", "create", "--name", "Acme")
        expect(yield* cli("usage", "--account", account.id, "--limit", "10")).toEqual({ data: [] })
      }),
    ),
  )

  it.effect("prints help as text on stdout", () =>
    run(
      Effect.gen(function* () {
        for (const argv of [[], ["help"], ["--help"], ["accounts", "help"]]) {
          log.mockClear()
          yield* runCli(argv)
          expect(String(log.mock.calls[0]![0])).toContain("accounts create --name N")
        }
      }),
    ),
  )

  it.effect("prints validation errors as JSON on stderr and fails", () =>
    run(
      Effect.gen(function* () {
        expect(yield* cliError("accounts", "create")).toEqual({
          message: "Missing required parameter: 'name'.",
          type: "invalid_request_error",
          code: "invalid_request",
          param: "name",
        })
        expect(yield* cliError("accounts", "create", "--name", "A", "--balance-usd=-1")).toMatchObject({
          code: "invalid_request",
          param: "balance_usd",
        })
        expect(
          (yield* cliError("accounts", "create", "--name", "A", "--balance-usd", "-1")).message,
        ).toContain("--balance-usd=")
        expect(yield* cliError("accounts", "create", "--name", "A", "--balance-usd", "lots")).toMatchObject({
          param: "balance_usd",
        })
        expect(yield* cliError("accounts", "create", "--name", "x".repeat(201))).toMatchObject({
          param: "name",
        })
        expect(yield* cliError("accounts", "create", "--name", "A", "--rpm", "1.5")).toMatchObject({
          param: "limits.rpm",
        })
        const account = yield* cli("accounts", "create", "--name", "Acme")
        expect(yield* cliError("accounts", "update", account.id, "--status", "closed")).toMatchObject({
          param: "status",
        })
        expect(yield* cliError("accounts", "credit", account.id)).toMatchObject({ param: "amount-usd" })
        expect(yield* cliError("accounts", "credit", account.id, "--amount-usd", "0")).toMatchObject({
          param: "amount_usd",
        })
        expect(yield* cliError("keys", "create")).toMatchObject({ param: "account" })
        expect(
          yield* cliError("keys", "create", "--account", account.id, "--expires-at", "soon"),
        ).toMatchObject({
          param: "expires_at",
        })
        expect(yield* cliError("usage")).toMatchObject({ param: "account" })
      }),
    ),
  )

  it.effect("refuses unknown commands, flags and arguments", () =>
    run(
      Effect.gen(function* () {
        expect((yield* cliError("nodes", "list")).message).toContain("Unknown command 'nodes'")
        expect((yield* cliError("accounts", "delete", "x")).message).toContain(
          "Unknown command 'accounts delete'",
        )
        expect((yield* cliError("accounts", "toString")).message).toContain("Unknown command")
        expect((yield* cliError("accounts", "list", "--colour", "red")).code).toBe("invalid_request")
        expect((yield* cliError("accounts", "get")).message).toBe("Missing the ID argument.")
        expect((yield* cliError("accounts", "get", "a", "b")).message).toBe("Unexpected argument 'b'.")
        expect((yield* cliError("accounts", "list", "extra")).message).toBe("Unexpected argument 'extra'.")
      }),
    ),
  )

  it.effect("reports a missing account or key as not_found", () =>
    run(
      Effect.gen(function* () {
        expect(yield* cliError("accounts", "get", "acct_missing")).toEqual({
          message: "No account with id 'acct_missing'.",
          type: "invalid_request_error",
          code: "not_found",
          param: null,
        })
        expect((yield* cliError("keys", "revoke", "key_missing")).code).toBe("not_found")
        expect((yield* cliError("keys", "list", "--account", "acct_missing")).code).toBe("not_found")
      }),
    ),
  )
})
