/**
 * The admin API (`/admin/v1/…`) without a transport: routing, body validation,
 * the operations on accounts, keys and usage, and the JSON presenters. The HTTP
 * server and the `swarmgate` CLI both call the operations here, so the two
 * surfaces validate and answer alike. Amounts are USD on the wire and integer
 * micro-dollars in the store.
 */
import { SqlClient } from "@effect/sql"
import {
  type Account,
  AccountLimits,
  type ApiKey,
  ApiKeys,
  keyState,
  microsToUsd,
  Repository,
  SettableAccountStatus,
  usdToMicros,
} from "@swarmgate/auth"
import { Limits } from "@swarmgate/gateway"
import { InvalidRequest } from "@swarmgate/protocol"
import { Database } from "@swarmgate/store"
import { Clock, Effect, Either, ParseResult, Schema } from "effect"
import * as AccountLifecycle from "./AccountLifecycle"
import type * as AdminConfig from "./AdminConfig"
import {
  AdminConflict,
  type AdminError,
  AdminNotFound,
  type AdminResponse,
  errorResponse,
  fromRepository,
  fromSql,
} from "./AdminErrors"
import * as Applications from "./Applications"
import * as BillingAdmin from "./BillingAdmin"
import * as Mail from "./Mail"

export interface AdminRequest {
  readonly method: string
  readonly segments: ReadonlyArray<string>
  readonly query: URLSearchParams
  /** Parsed JSON, or undefined when the request had no body. */
  readonly body: unknown
}

export type AdminServices =
  | Repository.Repository
  | ApiKeys.ApiKeys
  | SqlClient.SqlClient
  | Mail.Mailer
  | AdminConfig.AdminConfig

export * from "./AdminErrors"

type Admin<A> = Effect.Effect<A, AdminError, AdminServices>

// --- input schemas (snake_case, as on the wire) --------------------------------

/** 10^9 USD = 10^15 micros, still an exact integer in a double. */
export const MAX_USD = 1_000_000_000
export const MAX_NAME_LENGTH = 200
export const MAX_USAGE_LIMIT = 1000
export const DEFAULT_USAGE_LIMIT = 100
const MAX_UNIX_SECONDS = 253_402_300_799 // 9999-12-31T23:59:59Z

const Usd = Schema.Number.pipe(
  Schema.finite({ message: () => "must be a finite number" }),
  Schema.nonNegative({ message: () => "must not be negative" }),
  Schema.lessThanOrEqualTo(MAX_USD, { message: () => `must be at most ${MAX_USD}` }),
)

const PositiveUsd = Usd.pipe(
  Schema.filter((usd) => usdToMicros(usd) > 0, { message: () => "must be positive (at least 0.000001)" }),
)

const Name = Schema.String.pipe(
  Schema.minLength(1, { message: () => "must not be empty" }),
  Schema.maxLength(MAX_NAME_LENGTH, { message: () => `must be at most ${MAX_NAME_LENGTH} characters` }),
)

const isoDateTime = /^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?$/

/** Unix seconds (integer) or an ISO-8601 string on input; Unix milliseconds after decoding. */
const ExpiresAt = Schema.transformOrFail(Schema.Union(Schema.Number, Schema.String), Schema.Number, {
  strict: true,
  decode: (input, _, ast) => {
    if (typeof input === "number") {
      return Number.isSafeInteger(input) && input >= 0 && input <= MAX_UNIX_SECONDS
        ? ParseResult.succeed(input * 1000)
        : ParseResult.fail(new ParseResult.Type(ast, input, "must be Unix seconds (a non-negative integer)"))
    }
    const millis = isoDateTime.test(input) ? Date.parse(input) : Number.NaN
    return Number.isFinite(millis) && millis >= 0
      ? ParseResult.succeed(millis)
      : ParseResult.fail(new ParseResult.Type(ast, input, "must be an ISO-8601 date-time or Unix seconds"))
  },
  encode: (millis) => ParseResult.succeed(Math.floor(millis / 1000)),
})

export const CreateAccountInput = Schema.Struct({
  name: Name,
  balance_usd: Schema.optional(Usd),
  monthly_spend_limit_usd: Schema.optional(Schema.NullOr(Usd)),
  limits: Schema.optional(AccountLimits),
})

export const UpdateAccountInput = Schema.Struct({
  status: Schema.optional(SettableAccountStatus),
  email: Schema.optional(Applications.Email),
  payment_hold: Schema.optional(Schema.Boolean),
  monthly_spend_limit_usd: Schema.optional(Schema.NullOr(Usd)),
  limits: Schema.optional(AccountLimits),
})

export const CreditInput = Schema.Struct({ amount_usd: PositiveUsd })

export const ApproveInput = Schema.Struct({
  balance_usd: Schema.optional(Usd),
  monthly_spend_limit_usd: Schema.optional(Schema.NullOr(Usd)),
  limits: Schema.optional(AccountLimits),
})

export const CreateKeyInput = Schema.Struct({
  name: Schema.optional(Schema.NullOr(Name)),
  spend_limit_usd: Schema.optional(Schema.NullOr(Usd)),
  expires_at: Schema.optional(Schema.NullOr(ExpiresAt)),
})

export const UpdateKeyInput = Schema.Struct({
  disabled: Schema.optional(Schema.Boolean),
  spend_limit_usd: Schema.optional(Schema.NullOr(Usd)),
})

export const UsageQuery = Schema.Struct({
  account_id: Schema.String.pipe(Schema.minLength(1, { message: () => "must not be empty" })),
  key_id: Schema.optional(Schema.String),
  limit: Schema.optional(
    Schema.NumberFromString.pipe(
      Schema.int({ message: () => "must be an integer" }),
      Schema.between(1, MAX_USAGE_LIMIT, { message: () => `must be between 1 and ${MAX_USAGE_LIMIT}` }),
    ),
  ),
})

const issueMessage = (issue: ParseResult.ArrayFormatterIssue): InvalidRequest => {
  const param = issue.path.length === 0 ? null : issue.path.join(".")
  if (param === null) return new InvalidRequest({ message: `Invalid request: ${issue.message}`, param })
  switch (issue._tag) {
    case "Unexpected":
      return new InvalidRequest({ message: `Unknown parameter: '${param}'.`, param })
    case "Missing":
      return new InvalidRequest({ message: `Missing required parameter: '${param}'.`, param })
    default:
      return new InvalidRequest({ message: `Invalid '${param}': ${issue.message}.`, param })
  }
}

/** Validates a body: absent counts as `{}`, anything but an object, an unknown field or a bad value is a 400. */
export const decodeBody = <A, I>(
  schema: Schema.Schema<A, I>,
  body: unknown,
): Effect.Effect<A, InvalidRequest> => {
  const input = body === undefined ? {} : body
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    return Effect.fail(
      new InvalidRequest({ message: "The request body must be a JSON object.", param: null }),
    )
  }
  return Either.match(
    Schema.decodeUnknownEither(schema, { onExcessProperty: "error", errors: "first" })(input),
    {
      onLeft: (error) => Effect.fail(issueMessage(ParseResult.ArrayFormatter.formatErrorSync(error)[0]!)),
      onRight: Effect.succeed,
    },
  )
}

// --- presenters ------------------------------------------------------------------

const LIMIT_FIELDS = ["concurrency", "queue", "rpm", "rph", "daily", "weekly"] as const

const limitsView = (limits: AccountLimits) =>
  Object.fromEntries(LIMIT_FIELDS.map((field) => [field, limits[field] ?? null])) as {
    readonly [K in (typeof LIMIT_FIELDS)[number]]: number | null
  }

const unixSeconds = (millis: number) => Math.floor(millis / 1000)

export const accountView = (
  account: Account,
  money: { readonly heldMicros: number; readonly spentMonthMicros: number },
) => ({
  id: account.id,
  object: "account" as const,
  name: account.name,
  status: account.status,
  payment_hold: account.paymentHold,
  balance_usd: microsToUsd(account.balanceMicros),
  held_usd: microsToUsd(money.heldMicros),
  spent_month_usd: microsToUsd(money.spentMonthMicros),
  monthly_spend_limit_usd:
    account.monthlySpendLimitMicros === null ? null : microsToUsd(account.monthlySpendLimitMicros),
  limits: limitsView(account.limits),
  email: account.email,
  email_verified: account.emailVerified,
  created: unixSeconds(account.createdAt),
  closed_at: account.closedAt === null ? null : unixSeconds(account.closedAt),
})
export type AccountView = ReturnType<typeof accountView>

export const keyView = (key: ApiKey, spentMicros: number, now: number) => ({
  id: key.id,
  object: "api_key" as const,
  account_id: key.accountId,
  prefix: key.prefix,
  name: key.name,
  status: keyState(key, now),
  spend_limit_usd: key.spendLimitMicros === null ? null : microsToUsd(key.spendLimitMicros),
  spent_usd: microsToUsd(spentMicros),
  expires_at: key.expiresAt === null ? null : unixSeconds(key.expiresAt),
  created: unixSeconds(key.createdAt),
})
export type KeyView = ReturnType<typeof keyView>

/** The secret goes out in this one response and is never stored or shown again. */
export const createdKeyView = (key: ApiKey, secret: string, now: number) => {
  const { id, ...rest } = keyView(key, 0, now)
  return { id, key: secret, ...rest }
}
export type CreatedKeyView = ReturnType<typeof createdKeyView>

interface UsageRow {
  readonly request_id: string
  readonly key_id: string
  readonly model: string
  readonly prompt_tokens: number | string
  readonly completion_tokens: number | string
  readonly cost_micros: number | string
  readonly outcome: string
  readonly created_at: number | string
}

export const usageView = (row: UsageRow) => ({
  request_id: row.request_id,
  key_id: row.key_id,
  model: row.model,
  prompt_tokens: Database.toNumber(row.prompt_tokens),
  completion_tokens: Database.toNumber(row.completion_tokens),
  cost_usd: microsToUsd(Database.toNumber(row.cost_micros)),
  outcome: row.outcome,
  created: unixSeconds(Database.toNumber(row.created_at)),
})
export type UsageView = ReturnType<typeof usageView>

// --- spend sums --------------------------------------------------------------------

const startOfUtcMonth = (now: number) => {
  const date = new Date(now)
  return Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
}

const spentThisMonth = (accountIds: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const spent = new Map<string, number>()
    if (accountIds.length === 0) return spent
    const sql = yield* SqlClient.SqlClient
    const since = startOfUtcMonth(yield* Clock.currentTimeMillis)
    const rows = yield* sql<{ account_id: string; spent: number | string }>`
      SELECT account_id, SUM(cost_micros) AS spent FROM usage_records
      WHERE ${sql.in("account_id", accountIds)} AND created_at >= ${since}
      GROUP BY account_id`
    for (const row of rows) spent.set(row.account_id, Database.toNumber(row.spent))
    return spent
  }).pipe(fromSql)

const spentByKey = (keyIds: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const spent = new Map<string, number>()
    if (keyIds.length === 0) return spent
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ key_id: string; spent: number | string }>`
      SELECT key_id, SUM(cost_micros) AS spent FROM usage_records
      WHERE ${sql.in("key_id", keyIds)} GROUP BY key_id`
    for (const row of rows) spent.set(row.key_id, Database.toNumber(row.spent))
    return spent
  }).pipe(fromSql)

const presentAccounts = (accounts: ReadonlyArray<Account>) =>
  Effect.flatMap(BillingAdmin.accountMoney(accounts.map((a) => a.id)), (live) =>
    live !== undefined
      ? // In the server: the billing book, with open holds and charges not yet written.
        Effect.succeed(
          accounts.map((account) => {
            const money = live.get(account.id) ?? {
              availableMicros: account.balanceMicros,
              heldMicros: 0,
              spentMonthMicros: 0,
            }
            return accountView({ ...account, balanceMicros: money.availableMicros }, money)
          }),
        )
      : Effect.map(spentThisMonth(accounts.map((a) => a.id)), (spent) =>
          accounts.map((account) =>
            // The CLI (another process) cannot see a server's holds: the ledger alone.
            accountView(account, { heldMicros: 0, spentMonthMicros: spent.get(account.id) ?? 0 }),
          ),
        ),
  )

const presentAccount = (account: Account) => Effect.map(presentAccounts([account]), (views) => views[0]!)

const presentKeys = (keys: ReadonlyArray<ApiKey>) =>
  Effect.flatMap(
    Effect.flatMap(BillingAdmin.keySpent(keys.map((k) => k.id)), (live) =>
      live !== undefined ? Effect.succeed(live) : spentByKey(keys.map((k) => k.id)),
    ),
    (spent) =>
      Effect.map(Clock.currentTimeMillis, (now) =>
        keys.map((key) => keyView(key, spent.get(key.id) ?? 0, now)),
      ),
  )

const presentKey = (key: ApiKey) => Effect.map(presentKeys([key]), (views) => views[0]!)

// --- operations (shared by the HTTP admin API and the CLI) ---------------------------

const repository = Repository.Repository
const apiKeys = ApiKeys.ApiKeys

/** Drops cleared (null) limits so the stored JSON lists only what is set. */
const compactLimits = (limits: AccountLimits): AccountLimits =>
  Object.fromEntries(Object.entries(limits).filter(([, value]) => value !== undefined && value !== null))

const optionalMicros = (usd: number | null | undefined) =>
  usd === undefined ? undefined : usd === null ? null : usdToMicros(usd)

export const createAccount = (body: unknown): Admin<AccountView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(CreateAccountInput, body)
    const repo = yield* repository
    const account = yield* fromRepository(
      repo.createAccount({
        name: input.name,
        balanceMicros: input.balance_usd === undefined ? undefined : usdToMicros(input.balance_usd),
        monthlySpendLimitMicros: optionalMicros(input.monthly_spend_limit_usd),
        limits: input.limits === undefined ? undefined : compactLimits(input.limits),
      }),
    )
    return yield* presentAccount(account)
  })

/** With `usage_now` (the limit state) where this process admits requests: the server, not the CLI. */
export const getAccount = (id: string): Admin<AccountView & { readonly usage_now?: Limits.UsageNow }> =>
  Effect.flatMap(repository, (repo) => fromRepository(repo.getAccount(id))).pipe(
    Effect.flatMap((account) =>
      Effect.zipWith(presentAccount(account), Limits.usageNowOf(account), (view, usage_now) =>
        usage_now === undefined ? view : { ...view, usage_now },
      ),
    ),
  )

export const listAccounts = (): Admin<{ data: ReadonlyArray<AccountView> }> =>
  Effect.flatMap(repository, (repo) => fromRepository(repo.listAccounts())).pipe(
    Effect.flatMap(presentAccounts),
    Effect.map((data) => ({ data })),
  )

/** `limits` is merged into the current limits; a null field clears that limit. */
export const updateAccount = (id: string, body: unknown): Admin<AccountView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(UpdateAccountInput, body)
    const repo = yield* repository
    const current = yield* fromRepository(repo.getAccount(id))
    if (AccountLifecycle.isFinal(current)) return yield* Effect.fail(AccountLifecycle.closedConflict(current))
    if (current.status === "closing" && input.status !== undefined)
      return yield* Effect.fail(
        new AdminConflict({ message: `Account '${id}' is being closed; its status cannot be changed.` }),
      )
    if (input.email !== undefined && input.email !== current.email)
      yield* AccountLifecycle.changeEmail(current, input.email)
    const account = yield* fromRepository(
      repo.updateAccount(id, {
        status: input.status,
        paymentHold: input.payment_hold,
        monthlySpendLimitMicros: optionalMicros(input.monthly_spend_limit_usd),
        limits:
          input.limits === undefined ? undefined : compactLimits({ ...current.limits, ...input.limits }),
      }),
    )
    yield* (yield* apiKeys).invalidateAccount(id)
    return yield* presentAccount(account)
  })

export const creditAccount = (id: string, body: unknown): Admin<AccountView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(CreditInput, body)
    const repo = yield* repository
    const current = yield* fromRepository(repo.getAccount(id))
    if (AccountLifecycle.isFinal(current)) return yield* Effect.fail(AccountLifecycle.closedConflict(current))
    const account = yield* fromRepository(repo.addCredit(id, usdToMicros(input.amount_usd)))
    // Cached principals carry the balance; the next request must see the credit.
    yield* (yield* apiKeys).invalidateAccount(id)
    yield* BillingAdmin.afterCredit(id)
    return yield* presentAccount(account)
  })

export const createKey = (accountId: string, body: unknown): Admin<CreatedKeyView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(CreateKeyInput, body)
    const repo = yield* repository
    const account = yield* fromRepository(repo.getAccount(accountId))
    if (account.status === "closing" || account.status === "closed")
      return yield* Effect.fail(
        new AdminConflict({ message: `Account '${accountId}' is ${account.status}; it gets no new keys.` }),
      )
    const created = yield* fromRepository(
      repo.createKey(accountId, {
        name: input.name,
        spendLimitMicros: optionalMicros(input.spend_limit_usd),
        expiresAt: input.expires_at,
      }),
    )
    return createdKeyView(created.key, created.secret, yield* Clock.currentTimeMillis)
  })

export const listKeys = (accountId: string): Admin<{ data: ReadonlyArray<KeyView> }> =>
  Effect.gen(function* () {
    const repo = yield* repository
    yield* fromRepository(repo.getAccount(accountId))
    const keys = yield* fromRepository(repo.listKeys(accountId))
    return { data: yield* presentKeys(keys) }
  })

export const getKey = (id: string): Admin<KeyView> =>
  Effect.flatMap(repository, (repo) => fromRepository(repo.getKey(id))).pipe(Effect.flatMap(presentKey))

export const updateKey = (id: string, body: unknown): Admin<KeyView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(UpdateKeyInput, body)
    const repo = yield* repository
    const key = yield* fromRepository(
      repo.updateKey(id, {
        disabled: input.disabled,
        spendLimitMicros: optionalMicros(input.spend_limit_usd),
      }),
    )
    yield* (yield* apiKeys).invalidateKey(id)
    return yield* presentKey(key)
  })

export const revokeKey = (id: string): Admin<KeyView> =>
  Effect.gen(function* () {
    const repo = yield* repository
    const key = yield* fromRepository(repo.revokeKey(id))
    yield* (yield* apiKeys).invalidateKey(id)
    return yield* presentKey(key)
  })

/** `query` holds strings, as in a URL: `account_id`, optional `key_id` and `limit`. */
export const listUsage = (
  query: Readonly<Record<string, string>>,
): Admin<{ data: ReadonlyArray<UsageView> }> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(UsageQuery, query)
    const repo = yield* repository
    yield* fromRepository(repo.getAccount(input.account_id))
    const sql = yield* SqlClient.SqlClient
    const limit = input.limit ?? DEFAULT_USAGE_LIMIT
    const conditions = [sql`account_id = ${input.account_id}`]
    if (input.key_id !== undefined) conditions.push(sql`key_id = ${input.key_id}`)
    const rows = yield* fromSql(sql<UsageRow>`
      SELECT request_id, key_id, model, prompt_tokens, completion_tokens, cost_micros, outcome, created_at
      FROM usage_records WHERE ${sql.and(conditions)}
      ORDER BY created_at DESC, request_id DESC LIMIT ${limit}`)
    return { data: rows.map(usageView) }
  })

/** Prices per preset (USD per million tokens); 404 where nothing is billed (no billing service). */
export const listPrices = (): Admin<unknown> =>
  Effect.flatMap(BillingAdmin.priceList, (prices) =>
    prices === undefined
      ? Effect.fail(new AdminNotFound({ message: "Billing is not configured." }))
      : Effect.succeed(prices),
  )

export const closeAccount = (id: string): Admin<AccountView> =>
  Effect.flatMap(AccountLifecycle.close(id), presentAccount)

export const accountStatement = (id: string): Admin<AccountLifecycle.Statement> =>
  AccountLifecycle.statement(id)

export const listApplications = (status: string | null): Admin<unknown> => Applications.list(status)

export const getApplication = (id: string): Admin<Applications.ApplicationView> => Applications.get(id)

export const approveApplication = (id: string, body: unknown): Admin<Applications.ApplicationView> =>
  Effect.gen(function* () {
    const input = yield* decodeBody(ApproveInput, body)
    return yield* Applications.approve(id, {
      balanceMicros: input.balance_usd === undefined ? undefined : usdToMicros(input.balance_usd),
      monthlySpendLimitMicros: optionalMicros(input.monthly_spend_limit_usd),
      limits: input.limits === undefined ? undefined : compactLimits(input.limits),
    })
  })

export const rejectApplication = (id: string, body: unknown): Admin<Applications.ApplicationView> =>
  Effect.flatMap(decodeBody(Applications.RejectInput, body), (input) => Applications.reject(id, input.reason))

/** Mail kept while no SMTP server is configured (newest first, the last 200). */
export const listOutbox = (): Admin<unknown> =>
  Effect.flatMap(Mail.Mailer, (mailer) => fromSql(mailer.outbox)).pipe(
    Effect.map((data) => ({ object: "list" as const, data })),
  )

// --- routing -----------------------------------------------------------------------

const USAGE_QUERY_FIELDS = ["account_id", "key_id", "limit"] as const

const queryRecord = (query: URLSearchParams): Record<string, string> => {
  const record: Record<string, string> = {}
  for (const field of USAGE_QUERY_FIELDS) {
    const value = query.get(field)
    if (value !== null) record[field] = value
  }
  return record
}

type Handlers = Partial<Record<string, (request: AdminRequest) => Admin<unknown>>>

const ok = (body: unknown): AdminResponse => ({ status: 200, body })
const created = (body: unknown): AdminResponse => ({ status: 201, body })

/** The handlers of a known path by method; undefined for an unknown path. */
const route = (segments: ReadonlyArray<string>): Handlers | undefined => {
  if (segments.some((segment) => segment.length === 0)) return undefined
  const [collection, id, action, ...rest] = segments
  if (rest.length > 0) return undefined
  if (collection === "accounts") {
    if (id === undefined) return { GET: () => listAccounts(), POST: (r) => createAccount(r.body) }
    if (action === undefined) return { GET: () => getAccount(id), PATCH: (r) => updateAccount(id, r.body) }
    if (action === "credits") return { POST: (r) => creditAccount(id, r.body) }
    if (action === "keys") return { GET: () => listKeys(id), POST: (r) => createKey(id, r.body) }
    if (action === "close") return { POST: () => closeAccount(id) }
    if (action === "statement") return { GET: () => accountStatement(id) }
    return undefined
  }
  if (collection === "applications") {
    if (id === undefined) return { GET: (r) => listApplications(r.query.get("status")) }
    if (action === undefined) return { GET: () => getApplication(id) }
    if (action === "approve") return { POST: (r) => approveApplication(id, r.body) }
    if (action === "reject") return { POST: (r) => rejectApplication(id, r.body) }
    return undefined
  }
  if (collection === "outbox" && id === undefined) return { GET: () => listOutbox() }
  if (collection === "keys" && id !== undefined) {
    if (action === undefined) return { GET: () => getKey(id), PATCH: (r) => updateKey(id, r.body) }
    if (action === "revoke") return { POST: () => revokeKey(id) }
    return undefined
  }
  if (collection === "usage" && id === undefined) return { GET: (r) => listUsage(queryRecord(r.query)) }
  if (collection === "prices" && id === undefined) return { GET: () => listPrices() }
  return undefined
}

const isCreation = (method: string, segments: ReadonlyArray<string>) =>
  method === "POST" && (segments.length === 1 || segments[2] === "keys")

export const handleAdmin = (request: AdminRequest): Effect.Effect<AdminResponse, never, AdminServices> => {
  const handlers = route(request.segments)
  if (handlers === undefined) return Effect.succeed({ status: 404, body: undefined })
  const method = request.method.toUpperCase()
  const handler = handlers[method]
  if (handler === undefined) return Effect.succeed({ status: 405, body: undefined })
  return handler(request).pipe(
    Effect.map(isCreation(method, request.segments) ? created : ok),
    Effect.catchAll((error) => Effect.succeed(errorResponse(error))),
  )
}
