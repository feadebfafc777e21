/**
 * Billing on the admin side: live money figures for account and key views,
 * the price list, and `swarmgate ledger check`. In the server the billing book
 * is in context and is the source of the figures (it includes open holds and
 * charges not yet written); in the CLI, another process, it is absent and the
 * admin views fall back to the ledger in SQL.
 */
import type { SqlClient } from "@effect/sql"
import { Billing, LedgerCheck, Prices } from "@swarmgate/billing"
import { AdmissionUnavailable, InvalidRequest } from "@swarmgate/protocol"
import { Data, Effect, Option } from "effect"

const storeUnavailable = () =>
  new AdmissionUnavailable({
    message: "The account store is unavailable; try again shortly.",
    retryAfterSeconds: 1,
  })

const withBilling = <A>(
  use: (billing: Billing.BillingShape) => Effect.Effect<A, Billing.BillingUnavailable>,
): Effect.Effect<A | undefined, AdmissionUnavailable> =>
  Effect.flatMap(Effect.serviceOption(Billing.Billing), (billing) =>
    Option.isNone(billing)
      ? Effect.succeed(undefined)
      : Effect.catchTag(use(billing.value), "BillingUnavailable", () => Effect.fail(storeUnavailable())),
  )

/** Available, held and this month's spend per account, from the live book; undefined without one. */
export const accountMoney = (accountIds: ReadonlyArray<string>) =>
  withBilling((billing) => billing.accountMoney(accountIds))

/** All-time spend per key, from the live book; undefined without one. */
export const keySpent = (keyIds: ReadonlyArray<string>) => withBilling((billing) => billing.keySpent(keyIds))

/** After a credit through the admin API: the next reservation sees it. */
export const afterCredit = (accountId: string) => withBilling((billing) => billing.refresh([accountId]))

/** `GET /admin/v1/prices`; undefined when this process does not bill. */
export const priceList = withBilling((billing) =>
  Effect.succeed({ object: "list" as const, data: Prices.view(billing.prices) }),
)

/** The ledger does not add up; the report says where. */
export class LedgerDrift extends Data.TaggedError("LedgerDrift")<{
  readonly report: LedgerCheck.LedgerReport
}> {
  get code() {
    return "ledger_drift"
  }
}

/**
 * `swarmgate ledger check`: prints the report (JSON) and fails with
 * `LedgerDrift` when the ledger is inconsistent, so the command exits 1.
 */
export const ledgerCommand = (
  args: ReadonlyArray<string>,
): Effect.Effect<
  LedgerCheck.LedgerReport,
  InvalidRequest | LedgerDrift | AdmissionUnavailable,
  SqlClient.SqlClient
> => {
  const [action, ...rest] = args
  if (action !== "check" || rest.length > 0) {
    return Effect.fail(
      new InvalidRequest({ message: "Usage: swarmgate ledger check (no options).", param: null }),
    )
  }
  return LedgerCheck.check.pipe(
    Effect.catchTag("SqlError", () => Effect.fail(storeUnavailable())),
    Effect.filterOrFail(
      (report) => report.ok,
      (report) => new LedgerDrift({ report }),
    ),
  )
}

const printError = (message: string, type: string, code: string) =>
  Effect.sync(() => console.error(JSON.stringify({ error: { message, type, code, param: null } }, null, 2)))

/**
 * The CLI face of `ledgerCommand`: the report on stdout, errors on stderr as
 * the admin API's envelope; fails (exit 1) on drift or error.
 */
export const ledgerCli = (
  args: ReadonlyArray<string>,
): Effect.Effect<void, { readonly code: string }, SqlClient.SqlClient> =>
  Effect.matchEffect(ledgerCommand(args), {
    onSuccess: (report) => Effect.sync(() => console.log(JSON.stringify(report, null, 2))),
    onFailure: (error) =>
      Effect.zipRight(
        error._tag === "LedgerDrift"
          ? Effect.zipRight(
              Effect.sync(() => console.log(JSON.stringify(error.report, null, 2))),
              printError(
                `The ledger does not add up: ${error.report.problems.length} problem(s), listed on stdout.`,
                "server_error",
                error.code,
              ),
            )
          : printError(error.message, error.type, error.code),
        Effect.fail({ code: error.code }),
      ),
  })
