/**
 * Access by application (spec §1: granted on application during Preview):
 * apply → verify the address → an operator approves or rejects → the
 * applicant claims the key once. Every step mails the applicant; tokens are
 * single use and stored hashed (OneTimeLinks).
 */
import { randomUUID } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { type AccountLimits, Repository } from "@swarmgate/auth"
import { InvalidRequest, RateLimitExceeded, ValidationFailed } from "@swarmgate/protocol"
import { Database } from "@swarmgate/store"
import { Clock, Effect, Either, ParseResult, Schema } from "effect"
import { AdminConfig } from "./AdminConfig"
import { AdminConflict, AdminNotFound, catchSql, fromSql } from "./AdminErrors"
import * as Mail from "./Mail"
import * as MailTemplates from "./MailTemplates"
import * as OneTimeLinks from "./OneTimeLinks"

export const ApplicationStatus = Schema.Literal(
  "pending_verification",
  "pending_review",
  "approved",
  "rejected",
)
export type ApplicationStatus = typeof ApplicationStatus.Type

export const MAX_NAME_LENGTH = 200
export const MAX_EMAIL_LENGTH = 254
export const MAX_USE_CASE_LENGTH = 4000
export const MAX_REASON_LENGTH = 2000
const HOUR = 3_600_000

const text = (max: number) =>
  Schema.Trim.pipe(
    Schema.minLength(1, { message: () => "must not be empty" }),
    Schema.maxLength(max, { message: () => `must be at most ${max} characters` }),
  )

/** One address, no display name; compared in lower case. */
export const Email = Schema.Trim.pipe(
  Schema.maxLength(MAX_EMAIL_LENGTH, { message: () => `must be at most ${MAX_EMAIL_LENGTH} characters` }),
  Schema.pattern(/^[^\s@<>(),;:"[\]\\]+@[^\s@<>(),;:"[\]\\]+\.[^\s@<>(),;:"[\]\\]+$/, {
    message: () => "must be an email address such as name@example.com",
  }),
  Schema.transform(Schema.String, { strict: true, decode: (s) => s.toLowerCase(), encode: (s) => s }),
)

/** An empty organization field of a form means none. */
const Organization = Schema.Trim.pipe(
  Schema.maxLength(MAX_NAME_LENGTH, { message: () => `must be at most ${MAX_NAME_LENGTH} characters` }),
  Schema.transform(Schema.NullOr(Schema.String), {
    strict: true,
    decode: (s) => (s.length === 0 ? null : s),
    encode: (s) => s ?? "",
  }),
)

export const ApplyInput = Schema.Struct({
  name: text(MAX_NAME_LENGTH),
  email: Email,
  organization: Schema.optionalWith(Schema.NullOr(Organization), { default: () => null }),
  use_case: text(MAX_USE_CASE_LENGTH),
})
export type ApplyInput = typeof ApplyInput.Type

export const RejectInput = Schema.Struct({ reason: text(MAX_REASON_LENGTH) })

const decodeApply = Schema.decodeUnknownEither(ApplyInput, { errors: "all", onExcessProperty: "error" })

/** 422 with §2.6 `detail` entries for a bad application (JSON or form). */
export const validateApplication = (body: unknown): Effect.Effect<ApplyInput, ValidationFailed> => {
  if (typeof body !== "object" || body === null || Array.isArray(body))
    return Effect.fail(
      new ValidationFailed({
        detail: [{ loc: ["body"], msg: "Input should be a valid dictionary", type: "dict_type" }],
      }),
    )
  return Either.match(decodeApply(body), {
    onLeft: (error) =>
      Effect.fail(
        new ValidationFailed({
          detail: ParseResult.ArrayFormatter.formatErrorSync(error).map((issue) => ({
            loc: ["body", ...issue.path.map((p) => (typeof p === "number" ? p : String(p)))],
            msg:
              issue._tag === "Missing"
                ? "Field required"
                : issue._tag === "Unexpected"
                  ? "Extra inputs are not permitted"
                  : issue.message,
            type:
              issue._tag === "Missing"
                ? "missing"
                : issue._tag === "Unexpected"
                  ? "extra_forbidden"
                  : "value_error",
          })),
        }),
      ),
    onRight: Effect.succeed,
  })
}

// --- rows and views ---------------------------------------------------------------

interface ApplicationRow {
  readonly id: string
  readonly name: string
  readonly email: string
  readonly organization: string | null
  readonly use_case: string
  readonly status: string
  readonly reason: string | null
  readonly account_id: string | null
  readonly created_at: number | string
  readonly decided_at: number | string | null
}

const seconds = (millis: number | string) => Math.floor(Database.toNumber(millis) / 1000)

export const applicationView = (row: ApplicationRow) => ({
  id: row.id,
  object: "application" as const,
  name: row.name,
  email: row.email,
  organization: row.organization,
  use_case: row.use_case,
  status: row.status as ApplicationStatus,
  created: seconds(row.created_at),
  decided_at: row.decided_at === null ? null : seconds(row.decided_at),
  account_id: row.account_id,
  reason: row.reason,
})
export type ApplicationView = ReturnType<typeof applicationView>

/** What an applicant is told after applying: no more than their own application's state (no enumeration). */
export const receiptView = (row: ApplicationRow) => ({
  id: row.id,
  object: "application" as const,
  status: row.status as ApplicationStatus,
})

const findRow = (id: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<ApplicationRow>`SELECT * FROM applications WHERE id = ${id}`,
  ).pipe(
    fromSql,
    Effect.map((rows) => rows[0]),
  )

const getRow = (id: string) =>
  Effect.flatMap(findRow(id), (row) =>
    row === undefined
      ? Effect.fail(new AdminNotFound({ message: `No application with id '${id}'.` }))
      : Effect.succeed(row),
  )

const openRowFor = (email: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<ApplicationRow>`SELECT * FROM applications WHERE email = ${email}
      AND status IN ('pending_verification', 'pending_review')`,
  ).pipe(
    fromSql,
    Effect.map((rows) => rows[0]),
  )

// --- the applicant's side ------------------------------------------------------------

const link = (path: string, token: string) =>
  Effect.map(AdminConfig, (config) => `${config.publicUrl()}${path}?token=${encodeURIComponent(token)}`)

const sendVerification = (row: ApplicationRow) =>
  Effect.gen(function* () {
    const token = yield* OneTimeLinks.issue("apply_verify", row.id).pipe(fromSql)
    const url = yield* link("/apply/verify", token)
    yield* (yield* Mail.Mailer).send(MailTemplates.verifyApplication(row.email, row.name, url))
  })

/** Refuses a client past its hourly applications; else counts this one. */
const admitClient = (client: string) =>
  Effect.gen(function* () {
    const config = yield* AdminConfig
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const since = now - HOUR
    const recent = yield* sql<{ created_at: number | string }>`SELECT created_at FROM apply_attempts
      WHERE client = ${client} AND created_at > ${since} ORDER BY created_at LIMIT ${config.applyPerHour}`.pipe(
      fromSql,
    )
    if (recent.length >= config.applyPerHour) {
      const oldest = recent[0] === undefined ? now : Database.toNumber(recent[0].created_at)
      return yield* Effect.fail(
        new RateLimitExceeded({
          message: `Too many applications from this address; try again later (at most ${config.applyPerHour} per hour).`,
          retryAfterSeconds: Math.max(1, Math.ceil((oldest + HOUR - now) / 1000)),
        }),
      )
    }
    yield* sql`DELETE FROM apply_attempts WHERE created_at <= ${since}`.pipe(fromSql)
    yield* sql`INSERT INTO apply_attempts ${sql.insert({ client, created_at: now })}`.pipe(fromSql)
  })

/**
 * `POST /apply`: a new application, or — for an address with one open — that
 * one again (a new verification mail while it is unverified). The answer is
 * the same either way.
 */
export const apply = (body: unknown, client: string) =>
  Effect.gen(function* () {
    const input = yield* validateApplication(body)
    yield* admitClient(client)
    const sql = yield* SqlClient.SqlClient
    const open = yield* openRowFor(input.email)
    if (open !== undefined) {
      if (open.status === "pending_verification") yield* sendVerification(open)
      return receiptView(open)
    }
    const now = yield* Clock.currentTimeMillis
    const id = `app_${randomUUID().replaceAll("-", "")}`
    const inserted = yield* sql`INSERT INTO applications ${sql.insert({
      id,
      name: input.name,
      email: input.email,
      organization: input.organization,
      use_case: input.use_case,
      status: "pending_verification",
      reason: null,
      account_id: null,
      created_at: now,
      decided_at: null,
      updated_at: now,
    })}`.pipe(Effect.either)
    if (Either.isLeft(inserted)) {
      // Another request for the same address won the race (unique open address): answer with its application.
      const winner = yield* openRowFor(input.email)
      if (winner === undefined) return yield* fromSql(Effect.fail(inserted.left))
      return receiptView(winner)
    }
    const row = yield* getRow(id).pipe(Effect.catchTag("AdminNotFound", Effect.die))
    yield* sendVerification(row)
    return receiptView(row)
  })

/** `GET /apply/verify?token=…`: the address is confirmed; the application waits for review. */
export const verify = (token: string) =>
  Effect.gen(function* () {
    const used = yield* catchSql(OneTimeLinks.consume("apply_verify", token))
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    yield* sql`UPDATE applications SET status = 'pending_review', updated_at = ${now}
      WHERE id = ${used.subjectId} AND status = 'pending_verification'`.pipe(fromSql)
    return applicationView(yield* getRow(used.subjectId))
  })

/** `GET /apply/claim?token=…`: the key, unsealed once. */
export const claim = (token: string) =>
  Effect.gen(function* () {
    const used = yield* catchSql(OneTimeLinks.consume("claim", token))
    const row = yield* getRow(used.subjectId)
    if (used.secret === undefined) return yield* Effect.fail(new OneTimeLinks.LinkRefused({ reason: "used" }))
    return { application: applicationView(row), key: used.secret }
  })

// --- the operator's side -------------------------------------------------------------

export const list = (status: string | null) =>
  Effect.gen(function* () {
    if (status !== null && !Schema.is(ApplicationStatus)(status))
      return yield* Effect.fail(
        new InvalidRequest({
          message: `Unknown status '${status}'; use one of ${ApplicationStatus.literals.join(", ")}.`,
          param: "status",
        }),
      )
    const sql = yield* SqlClient.SqlClient
    const rows = yield* (
      status === null
        ? sql<ApplicationRow>`SELECT * FROM applications ORDER BY created_at DESC, id DESC`
        : sql<ApplicationRow>`SELECT * FROM applications WHERE status = ${status} ORDER BY created_at DESC, id DESC`
    ).pipe(fromSql)
    return { object: "list" as const, data: rows.map(applicationView) }
  })

export const get = (id: string) => Effect.map(getRow(id), applicationView)

export interface Approval {
  readonly balanceMicros?: number | undefined
  readonly monthlySpendLimitMicros?: number | null | undefined
  readonly limits?: AccountLimits | undefined
}

const notPendingReview = (row: ApplicationRow) =>
  new AdminConflict({
    message: `Application '${row.id}' is ${row.status}; only an application pending review can be decided.`,
  })

/**
 * Creates the account (address verified) and its key, and mails the claim
 * link. Of two approvals at once exactly one creates an account: the status
 * change is conditional and in the same transaction.
 */
export const approve = (id: string, approval: Approval) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const repo = yield* Repository.Repository
    const before = yield* getRow(id)
    if (before.status !== "pending_review") return yield* Effect.fail(notPendingReview(before))
    const token = yield* sql
      .withTransaction(
        Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const won = yield* sql<{
            id: string
          }>`UPDATE applications SET status = 'approved', decided_at = ${now},
          updated_at = ${now} WHERE id = ${id} AND status = 'pending_review' RETURNING id`
          if (won.length === 0) return undefined
          const account = yield* repo.createAccount({
            name: before.organization ?? before.name,
            email: before.email,
            emailVerified: true,
            balanceMicros: approval.balanceMicros,
            monthlySpendLimitMicros: approval.monthlySpendLimitMicros,
            limits: approval.limits,
          })
          const created = yield* repo.createKey(account.id, { name: "claimed" })
          yield* sql`UPDATE applications SET account_id = ${account.id} WHERE id = ${id}`
          return yield* OneTimeLinks.issue("claim", id, created.secret)
        }),
      )
      .pipe(fromSql)
    const row = yield* getRow(id)
    if (token === undefined) return yield* Effect.fail(notPendingReview(row))
    const url = yield* link("/apply/claim", token)
    yield* (yield* Mail.Mailer).send(MailTemplates.approved(row.email, row.name, url))
    return applicationView(row)
  })

/** Rejects an application under review or still unverified; the applicant is told the reason. */
export const reject = (id: string, reason: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const won = yield* sql<{ id: string }>`UPDATE applications SET status = 'rejected', reason = ${reason},
      decided_at = ${now}, updated_at = ${now}
      WHERE id = ${id} AND status IN ('pending_verification', 'pending_review') RETURNING id`.pipe(fromSql)
    const row = yield* getRow(id)
    if (won.length === 0) return yield* Effect.fail(notPendingReview(row))
    yield* OneTimeLinks.withdraw("apply_verify", id).pipe(fromSql)
    yield* (yield* Mail.Mailer).send(MailTemplates.rejected(row.email, row.name, reason))
    return applicationView(row)
  })
