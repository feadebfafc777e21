/**
 * The admin CLI (`swarmgate accounts …`, `swarmgate keys …`, `swarmgate usage`):
 * the admin API's operations run directly against the database, with the same
 * validation and the same JSON objects on stdout. Errors go to stderr as the
 * admin API's error envelope and fail the effect, so the process exits 1.
 */
import { parseArgs } from "node:util"
import { Admin, BillingAdmin } from "@swarmgate/admin"
import { InvalidRequest } from "@swarmgate/protocol"
import { Data, Effect } from "effect"

/** The command failed; its error has already been printed to stderr. */
export class CliFailed extends Data.TaggedError("CliFailed")<{ readonly code: string }> {
  override get message() {
    return `swarmgate: command failed (${this.code})`
  }
}

export const usage = `Usage: swarmgate <command> [options]     (DATABASE_URL, default sqlite:./data/swarmgate.db)

  accounts create --name N [--balance-usd X] [--monthly-spend-limit-usd X] [limits]
  accounts get ID
  accounts list
  accounts update ID [--status active|suspended|restricted] [--payment-hold true|false] [--email ADDRESS]
                     [--monthly-spend-limit-usd X|none] [limits]
  accounts credit ID --amount-usd X
  accounts close ID        new requests refused at once; closed (keys revoked, statement mailed) once
                           nothing runs: a running server finishes it
  accounts statement ID
  applications list [--status pending_verification|pending_review|approved|rejected]
  applications get ID
  applications approve ID [--balance-usd X] [--monthly-spend-limit-usd X] [limits]
  applications reject ID --reason TEXT
  outbox                   mail kept while no SWARMGATE_SMTP_URL is set (newest first)
  keys create --account ID [--name N] [--spend-limit-usd X] [--expires-at ISO-8601|unix-seconds]
  keys get ID
  keys list --account ID
  keys update ID [--disabled true|false] [--spend-limit-usd X|none]
  keys revoke ID
  usage --account ID [--key ID] [--limit N]
  ledger check             balances = credits − charges, one charge per usage record (exit 1 on drift)
  help

  limits: --concurrency N --queue N --rpm N --rph N --daily N --weekly N  (N or none)

Output is JSON on stdout; errors are JSON on stderr with exit status 1.
A running server sees changes made here within its key-cache TTL (1 s by default).`

type Services = Admin.AdminServices
type Flags = Record<string, string | boolean | undefined>
type Options = Record<string, { readonly type: "string" }>

const LIMIT_FLAGS = ["concurrency", "queue", "rpm", "rph", "daily", "weekly"] as const

const stringFlags = (...names: ReadonlyArray<string>): Options =>
  Object.fromEntries(names.map((name) => [name, { type: "string" as const }]))

const limitOptions = stringFlags(...LIMIT_FLAGS)

const numeric = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$/

/**
 * Flag text to a JSON value, so the admin API's schema judges it as it would a
 * request body: numbers and booleans when they look like one, `none` as null,
 * anything else passed on as a string for the schema to refuse by name.
 */
const jsonValue = (text: string | boolean | undefined): unknown => {
  if (typeof text !== "string") return text
  if (numeric.test(text)) return Number(text)
  if (text === "true") return true
  if (text === "false") return false
  if (text === "none") return null
  return text
}

/** Unix seconds stay numbers; any other text (an ISO date) stays a string. */
const expiryValue = (text: string | boolean | undefined): unknown =>
  typeof text === "string" && /^\d+$/.test(text) ? Number(text) : text

/** The JSON body from flags: absent flags are left out, as an API client would. */
const body = (entries: ReadonlyArray<readonly [string, unknown]>): Record<string, unknown> =>
  Object.fromEntries(entries.filter(([, value]) => value !== undefined))

const limitsBody = (flags: Flags) => {
  const limits = body(LIMIT_FLAGS.map((name) => [name, jsonValue(flags[name])]))
  return Object.keys(limits).length === 0 ? undefined : limits
}

const invalid = (message: string, param: string | null = null) => new InvalidRequest({ message, param })

interface Parsed {
  readonly flags: Flags
  readonly positionals: ReadonlyArray<string>
}

const parse = (args: ReadonlyArray<string>, options: Options, positionals: number) =>
  Effect.flatMap(
    Effect.try({
      try: (): Parsed => {
        const { values, positionals: found } = parseArgs({
          args: [...args],
          options,
          strict: true,
          allowPositionals: true,
        })
        return { flags: values, positionals: found }
      },
      catch: (error) => invalid(error instanceof Error ? error.message : String(error)),
    }),
    (parsed) =>
      parsed.positionals.length === positionals
        ? Effect.succeed(parsed)
        : Effect.fail(
            invalid(
              positionals === 0
                ? `Unexpected argument '${parsed.positionals[0]}'.`
                : parsed.positionals.length === 0
                  ? "Missing the ID argument."
                  : `Unexpected argument '${parsed.positionals[1]}'.`,
            ),
          ),
  )

const required = (flags: Flags, name: string) => {
  const value = flags[name]
  return typeof value === "string" ? Effect.succeed(value) : Effect.fail(invalid(`Missing --${name}.`, name))
}

type Command = (args: ReadonlyArray<string>) => Effect.Effect<unknown, Admin.AdminError, Services>

const accounts: Record<string, Command> = {
  create: (args) =>
    Effect.flatMap(
      parse(args, { ...stringFlags("name", "balance-usd", "monthly-spend-limit-usd"), ...limitOptions }, 0),
      ({ flags }) =>
        Admin.createAccount(
          body([
            ["name", flags.name],
            ["balance_usd", jsonValue(flags["balance-usd"])],
            ["monthly_spend_limit_usd", jsonValue(flags["monthly-spend-limit-usd"])],
            ["limits", limitsBody(flags)],
          ]),
        ),
    ),
  get: (args) => Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.getAccount(positionals[0]!)),
  list: (args) => Effect.flatMap(parse(args, {}, 0), () => Admin.listAccounts()),
  update: (args) =>
    Effect.flatMap(
      parse(
        args,
        { ...stringFlags("status", "payment-hold", "monthly-spend-limit-usd", "email"), ...limitOptions },
        1,
      ),
      ({ flags, positionals }) =>
        Admin.updateAccount(
          positionals[0]!,
          body([
            ["status", flags.status],
            ["email", flags.email],
            ["payment_hold", jsonValue(flags["payment-hold"])],
            ["monthly_spend_limit_usd", jsonValue(flags["monthly-spend-limit-usd"])],
            ["limits", limitsBody(flags)],
          ]),
        ),
    ),
  credit: (args) =>
    Effect.flatMap(parse(args, stringFlags("amount-usd"), 1), ({ flags, positionals }) =>
      Effect.flatMap(required(flags, "amount-usd"), (amount) =>
        Admin.creditAccount(positionals[0]!, { amount_usd: jsonValue(amount) }),
      ),
    ),
  close: (args) =>
    Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.closeAccount(positionals[0]!)),
  statement: (args) =>
    Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.accountStatement(positionals[0]!)),
}

const applications: Record<string, Command> = {
  list: (args) =>
    Effect.flatMap(parse(args, stringFlags("status"), 0), ({ flags }) =>
      Admin.listApplications(typeof flags.status === "string" ? flags.status : null),
    ),
  get: (args) =>
    Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.getApplication(positionals[0]!)),
  approve: (args) =>
    Effect.flatMap(
      parse(args, { ...stringFlags("balance-usd", "monthly-spend-limit-usd"), ...limitOptions }, 1),
      ({ flags, positionals }) =>
        Admin.approveApplication(
          positionals[0]!,
          body([
            ["balance_usd", jsonValue(flags["balance-usd"])],
            ["monthly_spend_limit_usd", jsonValue(flags["monthly-spend-limit-usd"])],
            ["limits", limitsBody(flags)],
          ]),
        ),
    ),
  reject: (args) =>
    Effect.flatMap(parse(args, stringFlags("reason"), 1), ({ flags, positionals }) =>
      Effect.flatMap(required(flags, "reason"), (reason) =>
        Admin.rejectApplication(positionals[0]!, { reason }),
      ),
    ),
}

const keys: Record<string, Command> = {
  create: (args) =>
    Effect.flatMap(
      parse(args, stringFlags("account", "name", "spend-limit-usd", "expires-at"), 0),
      ({ flags }) =>
        Effect.flatMap(required(flags, "account"), (account) =>
          Admin.createKey(
            account,
            body([
              ["name", flags.name],
              ["spend_limit_usd", jsonValue(flags["spend-limit-usd"])],
              ["expires_at", expiryValue(flags["expires-at"])],
            ]),
          ),
        ),
    ),
  get: (args) => Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.getKey(positionals[0]!)),
  list: (args) =>
    Effect.flatMap(parse(args, stringFlags("account"), 0), ({ flags }) =>
      Effect.flatMap(required(flags, "account"), Admin.listKeys),
    ),
  update: (args) =>
    Effect.flatMap(parse(args, stringFlags("disabled", "spend-limit-usd"), 1), ({ flags, positionals }) =>
      Admin.updateKey(
        positionals[0]!,
        body([
          ["disabled", jsonValue(flags.disabled)],
          ["spend_limit_usd", jsonValue(flags["spend-limit-usd"])],
        ]),
      ),
    ),
  revoke: (args) => Effect.flatMap(parse(args, {}, 1), ({ positionals }) => Admin.revokeKey(positionals[0]!)),
}

const usageCommand: Command = (args) =>
  Effect.flatMap(parse(args, stringFlags("account", "key", "limit"), 0), ({ flags }) =>
    Effect.flatMap(required(flags, "account"), (account) =>
      Admin.listUsage(
        body([
          ["account_id", account],
          ["key_id", flags.key],
          ["limit", flags.limit],
        ]) as Record<string, string>,
      ),
    ),
  )

const isHelp = (word: string | undefined) =>
  word === undefined || word === "help" || word === "--help" || word === "-h"

const command = (
  argv: ReadonlyArray<string>,
): Effect.Effect<unknown, Admin.AdminError, Services> | "help" => {
  const [group, action, ...rest] = argv
  if (isHelp(group)) return "help"
  if (group === "usage") return usageCommand(argv.slice(1))
  if (group === "outbox") return Effect.flatMap(parse(argv.slice(1), {}, 0), () => Admin.listOutbox())
  const table =
    group === "accounts"
      ? accounts
      : group === "keys"
        ? keys
        : group === "applications"
          ? applications
          : undefined
  if (table === undefined) return Effect.fail(invalid(`Unknown command '${group}'. Run 'swarmgate help'.`))
  if (isHelp(action)) return "help"
  const run = Object.hasOwn(table, action!) ? table[action!] : undefined
  if (run === undefined)
    return Effect.fail(invalid(`Unknown command '${group} ${action}'. Run 'swarmgate help'.`))
  return run(rest)
}

export const runCli = (argv: ReadonlyArray<string>): Effect.Effect<void, CliFailed, Services> => {
  if (argv[0] === "ledger" && !isHelp(argv[1])) {
    return Effect.mapError(BillingAdmin.ledgerCli(argv.slice(1)), (e) => new CliFailed({ code: e.code }))
  }
  const result = command(argv)
  if (result === "help") return Effect.sync(() => console.log(usage))
  return Effect.matchEffect(result, {
    onSuccess: (value) => Effect.sync(() => console.log(JSON.stringify(value, null, 2))),
    onFailure: (error) =>
      Effect.zipRight(
        Effect.sync(() => console.error(JSON.stringify(Admin.errorBody(error), null, 2))),
        Effect.fail(new CliFailed({ code: error.code })),
      ),
  })
}
