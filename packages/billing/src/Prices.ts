/**
 * Prices per model preset, per million prompt and completion tokens, in
 * integer micro-dollars. Defaults go by the preset's suffix (`-prime`,
 * `-swift`), so a rebranded deployment keeps them; `SWARMGATE_PRICES` (JSON)
 * or `SWARMGATE_PRICES_FILE` (a JSON file) override them per model id.
 */
import { readFileSync } from "node:fs"
import { Config, ConfigError, Data, Effect, Either, Option } from "effect"

export interface Price {
  readonly promptMicrosPerMillion: number
  readonly completionMicrosPerMillion: number
}

/** Model id → price; every preset the gateway serves has one. */
export type PriceTable = ReadonlyMap<string, Price>

export const MICROS_PER_USD = 1_000_000

/** The most a million tokens may cost (USD): keeps every cost an exact integer in a double. */
export const MAX_USD_PER_MILLION = 1_000

/** Defaults by preset suffix, USD per million tokens (README: Billing). */
export const DEFAULT_PRICES_USD: Readonly<Record<string, { prompt: number; completion: number }>> = {
  prime: { prompt: 2.5, completion: 10 },
  swift: { prompt: 0.15, completion: 0.6 },
}

export class InvalidPrices extends Data.TaggedError("InvalidPrices")<{ readonly reason: string }> {
  override get message() {
    return this.reason
  }
}

/**
 * The cost of a run, rounded up to a whole micro-dollar. It grows with each
 * count, so the cost of the worst case is never below the cost of what ran.
 */
export const costMicros = (price: Price, promptTokens: number, completionTokens: number): number => {
  const scaled =
    promptTokens * price.promptMicrosPerMillion + completionTokens * price.completionMicrosPerMillion
  // `scaled` is an exact integer below 2^53, so the quotient is never within rounding of a whole number unless it is one.
  return Math.ceil(scaled / 1_000_000)
}

const suffixOf = (modelId: string) => modelId.slice(modelId.lastIndexOf("-") + 1)

const usdToMicros = (usd: number) => Math.round(usd * MICROS_PER_USD)

const priceFromUsd = (prompt: number, completion: number): Price => ({
  promptMicrosPerMillion: usdToMicros(prompt),
  completionMicrosPerMillion: usdToMicros(completion),
})

const validUsd = (value: unknown): value is number =>
  typeof value === "number" && Number.isFinite(value) && value >= 0 && value <= MAX_USD_PER_MILLION

/**
 * The price table for `modelIds`: defaults by suffix, then `overrides`
 * (`{"<model>": {"prompt_usd_per_million": n, "completion_usd_per_million": n}}`).
 * A model with no default and no override, an override for a model that is
 * not served, or a malformed value is an error: a typo must not make a model free.
 */
export const resolve = (
  modelIds: ReadonlyArray<string>,
  overrides: unknown = {},
): Either.Either<PriceTable, InvalidPrices> => {
  const fail = (reason: string) => Either.left(new InvalidPrices({ reason }))
  if (typeof overrides !== "object" || overrides === null || Array.isArray(overrides)) {
    return fail("prices must be a JSON object keyed by model id")
  }
  const table = new Map<string, Price>()
  for (const id of modelIds) {
    const defaults = DEFAULT_PRICES_USD[suffixOf(id)]
    if (defaults !== undefined) table.set(id, priceFromUsd(defaults.prompt, defaults.completion))
  }
  for (const [id, value] of Object.entries(overrides)) {
    if (!modelIds.includes(id))
      return fail(`prices name an unknown model '${id}' (served: ${modelIds.join(", ")})`)
    if (typeof value !== "object" || value === null) return fail(`prices.${id} must be an object`)
    const entry = value as Record<string, unknown>
    const extra = Object.keys(entry).filter(
      (k) => k !== "prompt_usd_per_million" && k !== "completion_usd_per_million",
    )
    if (extra.length > 0) return fail(`prices.${id} has an unknown field '${extra[0]}'`)
    const current = table.get(id)
    const prompt =
      entry.prompt_usd_per_million ?? (current && current.promptMicrosPerMillion / MICROS_PER_USD)
    const completion =
      entry.completion_usd_per_million ?? (current && current.completionMicrosPerMillion / MICROS_PER_USD)
    if (!validUsd(prompt) || !validUsd(completion)) {
      return fail(
        `prices.${id}: prompt_usd_per_million and completion_usd_per_million must be numbers from 0 to ${MAX_USD_PER_MILLION}`,
      )
    }
    table.set(id, priceFromUsd(prompt, completion))
  }
  const missing = modelIds.filter((id) => !table.has(id))
  if (missing.length > 0) return fail(`no price for ${missing.join(", ")}: set it in SWARMGATE_PRICES`)
  return Either.right(table)
}

const readOverrides = (text: Option.Option<string>, file: Option.Option<string>) => {
  if (Option.isSome(text) && Option.isSome(file)) {
    return Either.left("set SWARMGATE_PRICES or SWARMGATE_PRICES_FILE, not both")
  }
  const source = Option.isSome(file)
    ? Either.try({
        try: () => readFileSync(file.value, "utf8"),
        catch: (e) => `SWARMGATE_PRICES_FILE: ${e instanceof Error ? e.message : String(e)}`,
      })
    : Either.right(Option.getOrElse(text, () => "{}"))
  return Either.flatMap(source, (json) =>
    Either.try({
      try: () => JSON.parse(json) as unknown,
      catch: () => "prices are not valid JSON",
    }),
  )
}

/** The price table from `SWARMGATE_PRICES` / `SWARMGATE_PRICES_FILE` over the defaults. */
export const fromConfig = (
  modelIds: ReadonlyArray<string>,
): Effect.Effect<PriceTable, ConfigError.ConfigError> =>
  Effect.flatMap(
    Config.all([
      Config.option(Config.string("SWARMGATE_PRICES")),
      Config.option(Config.string("SWARMGATE_PRICES_FILE")),
    ]),
    ([text, file]) =>
      Either.match(
        Either.flatMap(readOverrides(text, file), (overrides) =>
          Either.mapLeft(resolve(modelIds, overrides), (e) => e.reason),
        ),
        {
          onLeft: (reason) => Effect.fail(ConfigError.InvalidData(["SWARMGATE_PRICES"], reason)),
          onRight: Effect.succeed,
        },
      ),
  )

/** Prices as the admin API shows them: USD per million tokens. */
export const view = (prices: PriceTable) =>
  [...prices].map(([model, price]) => ({
    model,
    prompt_usd_per_million: price.promptMicrosPerMillion / MICROS_PER_USD,
    completion_usd_per_million: price.completionMicrosPerMillion / MICROS_PER_USD,
  }))
