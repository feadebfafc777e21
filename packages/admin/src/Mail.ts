/**
 * Mail to applicants and account holders. With `SWARMGATE_SMTP_URL` it goes
 * out over SMTP (nodemailer); without, it is kept in the outbox table
 * (`GET /admin/v1/outbox`, newest first, the last 200), so `npm start` alone
 * can complete every flow. The log names recipient and subject only: links
 * carry tokens.
 */
import { randomUUID } from "node:crypto"
import { SqlClient } from "@effect/sql"
import { Database } from "@swarmgate/store"
import { Clock, Context, Effect, Layer, Option, Redacted, type Scope } from "effect"
import nodemailer from "nodemailer"
import { AdminConfig } from "./AdminConfig"

export interface Mail {
  readonly to: string
  readonly subject: string
  /** The plain-text part; it holds every link as an absolute URL. */
  readonly text: string
  readonly html?: string | undefined
}

export interface OutboxEntry {
  readonly id: string
  readonly object: "mail"
  readonly to: string
  readonly subject: string
  readonly text: string
  readonly created: number
}

export const OUTBOX_SIZE = 200
const SEND_TIMEOUT_MILLIS = 10_000

export interface MailerShape {
  /** Sends or keeps the mail; a failure is logged (recipient and subject), never the caller's. */
  readonly send: (mail: Mail) => Effect.Effect<void>
  /** The kept mail, newest first; empty when mail goes out over SMTP. */
  readonly outbox: Effect.Effect<ReadonlyArray<OutboxEntry>, unknown>
}

export class Mailer extends Context.Tag("@swarmgate/admin/Mailer")<Mailer, MailerShape>() {}

const logged = (mail: Mail, how: string) =>
  Effect.logInfo(`mail ${how}`).pipe(Effect.annotateLogs({ to: mail.to, subject: mail.subject }))

const failed = (mail: Mail, cause: unknown) =>
  Effect.logWarning("mail not sent").pipe(
    Effect.annotateLogs({
      to: mail.to,
      subject: mail.subject,
      reason: cause instanceof Error ? cause.message : String(cause),
    }),
  )

interface OutboxRow {
  readonly id: string
  readonly recipient: string
  readonly subject: string
  readonly text_body: string
  readonly created_at: number | string
}

/** Keeps mail in SQL (shared by every instance on one database). */
export const makeOutbox = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const keep = (mail: Mail) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      yield* sql`INSERT INTO mail_outbox ${sql.insert({
        id: `mail_${randomUUID().replaceAll("-", "")}`,
        recipient: mail.to,
        subject: mail.subject,
        text_body: mail.text,
        html_body: mail.html ?? null,
        created_at: now,
      })}`
      // Only the newest are kept; older mail is trimmed on the way (same SQL on SQLite and PostgreSQL).
      yield* sql`DELETE FROM mail_outbox WHERE created_at < (
        SELECT created_at FROM mail_outbox ORDER BY created_at DESC LIMIT 1 OFFSET ${OUTBOX_SIZE - 1}
      )`
    })
  const mailer: MailerShape = {
    send: (mail) =>
      keep(mail).pipe(
        Effect.zipRight(logged(mail, "kept in the outbox (no SWARMGATE_SMTP_URL)")),
        Effect.catchAllCause((cause) => failed(mail, cause)),
      ),
    outbox: Effect.map(
      sql<OutboxRow>`SELECT id, recipient, subject, text_body, created_at FROM mail_outbox
        ORDER BY created_at DESC, id DESC LIMIT ${OUTBOX_SIZE}`,
      (rows) =>
        rows.map(
          (row): OutboxEntry => ({
            id: row.id,
            object: "mail",
            to: row.recipient,
            subject: row.subject,
            text: row.text_body,
            created: Math.floor(Database.toNumber(row.created_at) / 1000),
          }),
        ),
    ),
  }
  return mailer
})

/** Sends over SMTP; the transport is closed with the layer. */
export const makeSmtp = (url: Redacted.Redacted, from: string) =>
  Effect.map(
    Effect.acquireRelease(
      Effect.sync(() => nodemailer.createTransport(Redacted.value(url))),
      (transport) => Effect.sync(() => transport.close()),
    ),
    (transport): MailerShape => ({
      send: (mail) =>
        Effect.tryPromise(() =>
          transport.sendMail({ from, to: mail.to, subject: mail.subject, text: mail.text, html: mail.html }),
        ).pipe(
          Effect.timeout(SEND_TIMEOUT_MILLIS),
          Effect.zipRight(logged(mail, "sent")),
          Effect.catchAllCause((cause) => failed(mail, cause)),
        ),
      outbox: Effect.succeed([]),
    }),
  )

/** SMTP when `smtpUrl` is configured, else the outbox. */
export const layer = Layer.scoped(
  Mailer,
  Effect.flatMap(
    AdminConfig,
    (config): Effect.Effect<MailerShape, never, SqlClient.SqlClient | Scope.Scope> =>
      Option.match(config.smtpUrl, {
        onNone: () => makeOutbox,
        onSome: (url) => makeSmtp(url, config.mailFrom),
      }),
  ),
)
