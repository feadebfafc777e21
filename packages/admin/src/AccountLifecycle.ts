/**
 * An account's address and its end. A new address is unverified until its
 * mailed link is followed (new requests get 403 account_restricted
 * meanwhile). Closing is two steps: `closing` refuses new requests at once
 * while running ones finish and are settled; then the closer makes it
 * `closed` — every key revoked, the final statement mailed. The closer runs
 * in every server instance; the conditional status change lets one win.
 */
import { SqlClient } from "@effect/sql"
import { type Account, ApiKeys, microsToUsd, Repository } from "@swarmgate/auth"
import { Billing } from "@swarmgate/billing"
import { Limits } from "@swarmgate/gateway"
import { Database } from "@swarmgate/store"
import { Clock, Context, Effect, Layer, Option, Queue } from "effect"
import { AdminConfig } from "./AdminConfig"
import { AdminConflict, catchSql, fromRepository, fromSql } from "./AdminErrors"
import * as Mail from "./Mail"
import * as MailTemplates from "./MailTemplates"
import * as OneTimeLinks from "./OneTimeLinks"

export const isFinal = (account: Account) => account.status === "closed"

export const closedConflict = (account: Account) =>
  new AdminConflict({
    message: `Account '${account.id}' is closed; a closed account cannot be changed or reopened.`,
  })

/** Sets a new, unverified address and mails it the link that verifies it. */
export const changeEmail = (account: Account, email: string) =>
  Effect.gen(function* () {
    const repo = yield* Repository.Repository
    const updated = yield* fromRepository(repo.updateAccount(account.id, { email, emailVerified: false }))
    const token = yield* OneTimeLinks.issue("email_verify", account.id).pipe(fromSql)
    const config = yield* AdminConfig
    const url = `${config.publicUrl()}/account/verify?token=${encodeURIComponent(token)}`
    yield* (yield* Mail.Mailer).send(MailTemplates.verifyAddress(email, account.name, url))
    return updated
  })

/** `GET /account/verify?token=…`: the address is confirmed and the keys work again. */
export const verifyEmail = (token: string) =>
  Effect.gen(function* () {
    const used = yield* catchSql(OneTimeLinks.consume("email_verify", token))
    const repo = yield* Repository.Repository
    const account = yield* fromRepository(repo.updateAccount(used.subjectId, { emailVerified: true }))
    yield* (yield* ApiKeys.ApiKeys).invalidateAccount(account.id)
    return account
  })

/** `POST /admin/v1/accounts/{id}/close`: closing now (new requests refused); closed once nothing runs. */
export const close = (id: string) =>
  Effect.gen(function* () {
    const repo = yield* Repository.Repository
    const account = yield* fromRepository(repo.getAccount(id))
    if (account.status === "closing" || account.status === "closed") return account
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    yield* sql`UPDATE accounts SET status = 'closing', updated_at = ${now}
      WHERE id = ${id} AND status NOT IN ('closing', 'closed')`.pipe(fromSql)
    yield* (yield* ApiKeys.ApiKeys).invalidateAccount(id)
    const closer = yield* Effect.serviceOption(Closer)
    if (Option.isSome(closer)) yield* closer.value.wake
    return yield* fromRepository(repo.getAccount(id))
  })

export interface Statement {
  readonly account_id: string
  readonly credits_usd: number
  readonly charges_usd: number
  /** Charges are exact (unused holds are released, never charged), so nothing is refunded: 0. */
  readonly refunds_usd: number
  readonly balance_usd: number
  readonly closed_at: number | null
}

/** From the ledger: credits and charges in SQL (final once the account is closed). */
export const statement = (id: string) =>
  Effect.gen(function* () {
    const repo = yield* Repository.Repository
    const account = yield* fromRepository(repo.getAccount(id))
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ kind: string; total: number | string | null }>`
      SELECT kind, SUM(amount_micros) AS total FROM balance_movements WHERE account_id = ${id} GROUP BY kind`.pipe(
      fromSql,
    )
    const total = (kind: string) => Database.toNumber(rows.find((r) => r.kind === kind)?.total ?? 0)
    return {
      account_id: account.id,
      credits_usd: microsToUsd(total("credit")),
      charges_usd: microsToUsd(total("charge")),
      refunds_usd: microsToUsd(total("refund")),
      balance_usd: microsToUsd(account.balanceMicros),
      closed_at: account.closedAt === null ? null : Math.floor(account.closedAt / 1000),
    } satisfies Statement
  })

/** Nothing runs or waits for the account here (or, with Redis, anywhere) and no money is held. */
const idle = (account: Account) =>
  Effect.gen(function* () {
    const usage = yield* Limits.usageNowOf(account)
    if (usage === undefined || usage.concurrency > 0 || usage.queued > 0) return false
    const billing = yield* Effect.serviceOption(Billing.Billing)
    if (Option.isNone(billing)) return true
    const money = yield* billing.value.accountMoney([account.id])
    if ((money.get(account.id)?.heldMicros ?? 0) > 0) return false
    // The statement is read from SQL: every charge must be written first.
    yield* billing.value.flush
    return true
  }).pipe(Effect.orElseSucceed(() => false))

/** One account from closing to closed, if it is idle: keys revoked, status final, statement mailed. */
export const finish = (account: Account) =>
  Effect.gen(function* () {
    if (!(yield* idle(account))) return false
    const sql = yield* SqlClient.SqlClient
    const repo = yield* Repository.Repository
    const now = yield* Clock.currentTimeMillis
    yield* fromRepository(repo.revokeKeysOf(account.id))
    const won = yield* sql<{
      id: string
    }>`UPDATE accounts SET status = 'closed', closed_at = ${now}, updated_at = ${now}
      WHERE id = ${account.id} AND status = 'closing' RETURNING id`.pipe(fromSql)
    yield* (yield* ApiKeys.ApiKeys).invalidateAccount(account.id)
    if (won.length === 0) return false
    const final = yield* statement(account.id)
    if (account.email !== null)
      yield* (yield* Mail.Mailer).send(
        MailTemplates.statement(account.email, account.name, {
          accountId: account.id,
          creditsUsd: final.credits_usd,
          chargesUsd: final.charges_usd,
          refundsUsd: final.refunds_usd,
          balanceUsd: final.balance_usd,
          closedAt: new Date(now).toISOString(),
        }),
      )
    return true
  })

/** While an account is closing, how often it is looked at; with none, how often another instance's (or a crashed one's) closings are looked for. */
const CLOSING_INTERVAL_MILLIS = 250
const IDLE_INTERVAL_MILLIS = 5_000

/** Every closing account looked at once (closed if idle); how many are still closing. */
export const closeIdleAccounts = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const repo = yield* Repository.Repository
  const ids = yield* sql<{ id: string }>`SELECT id FROM accounts WHERE status = 'closing'`
  let open = 0
  for (const { id } of ids) {
    const account = yield* repo.getAccount(id)
    if (!(yield* finish(account))) open++
  }
  return open
})

/** Wakes the closer at once (a close through this instance); absent in the CLI. */
export class Closer extends Context.Tag("@swarmgate/admin/Closer")<
  Closer,
  { readonly wake: Effect.Effect<void> }
>() {}

/**
 * The closer, for as long as the server runs: quick rounds while an account
 * is closing, a slow look otherwise, woken at once by a close made here.
 */
export const closerLayer = Layer.scoped(
  Closer,
  Effect.gen(function* () {
    const signal = yield* Queue.sliding<void>(1)
    const round = closeIdleAccounts.pipe(
      // A database outage is reported where requests meet it; here it would repeat with every round.
      Effect.catchAllCause((cause) => Effect.as(Effect.logDebug("account closer: will try again", cause), 1)),
      Effect.flatMap((open) =>
        Effect.race(
          Queue.take(signal),
          Effect.sleep(open > 0 ? CLOSING_INTERVAL_MILLIS : IDLE_INTERVAL_MILLIS),
        ),
      ),
    )
    yield* Effect.forkScoped(Effect.forever(round))
    return { wake: Effect.asVoid(Queue.offer(signal, undefined)) }
  }),
)
