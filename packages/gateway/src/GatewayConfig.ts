/**
 * Limits and timings of the HTTP surface. Defaults are the documented ones;
 * `fromEnv` reads the environment variables listed in the README.
 */
import { Config, Context, Effect, Layer, Option, Redacted } from "effect"

export interface GatewayConfigShape {
  /** 413 above this many body bytes (decided from Content-Length, enforced while reading). */
  readonly maxBodyBytes: number
  /** Decoded bytes of one data-URL image; above it 413 with the part as `param`. */
  readonly maxImageBytes: number
  /** 408 when the body has not arrived this long after the request started (spec: 55 s). */
  readonly bodyTimeoutMillis: number
  /** The request line and headers must arrive within this (slow-header clients are cut with 408). */
  readonly headersTimeoutMillis: number
  /** A comment line on a stream that has been silent this long. */
  readonly keepAliveIntervalMillis: number
  /** Open requests from which the old generation's growth is tight (HeapPolicy.ts; 0: never). */
  readonly heapTightAt: number
  /** `Authorization: Bearer …` for `/admin/v1`; the admin API is off when absent. */
  readonly adminToken: Option.Option<Redacted.Redacted>
}

export class GatewayConfig extends Context.Tag("@swarmgate/gateway/GatewayConfig")<
  GatewayConfig,
  GatewayConfigShape
>() {}

export const defaults: GatewayConfigShape = {
  maxBodyBytes: 8 * 1024 * 1024,
  maxImageBytes: 5 * 1024 * 1024,
  bodyTimeoutMillis: 55_000,
  headersTimeoutMillis: 10_000,
  keepAliveIntervalMillis: 15_000,
  heapTightAt: 256,
  adminToken: Option.none(),
}

export const config = Config.all({
  maxBodyBytes: Config.integer("SWARMGATE_MAX_BODY_BYTES").pipe(Config.withDefault(defaults.maxBodyBytes)),
  maxImageBytes: Config.integer("SWARMGATE_MAX_IMAGE_BYTES").pipe(Config.withDefault(defaults.maxImageBytes)),
  bodyTimeoutMillis: Config.integer("SWARMGATE_BODY_TIMEOUT_MS").pipe(
    Config.withDefault(defaults.bodyTimeoutMillis),
  ),
  headersTimeoutMillis: Config.integer("SWARMGATE_HEADERS_TIMEOUT_MS").pipe(
    Config.validate({
      message: "SWARMGATE_HEADERS_TIMEOUT_MS must be at least 1",
      validation: (n) => n >= 1,
    }),
    Config.withDefault(defaults.headersTimeoutMillis),
  ),
  keepAliveIntervalMillis: Config.integer("SWARMGATE_KEEPALIVE_MS").pipe(
    Config.withDefault(defaults.keepAliveIntervalMillis),
  ),
  heapTightAt: Config.integer("SWARMGATE_HEAP_TIGHT_AT").pipe(
    Config.validate({ message: "SWARMGATE_HEAP_TIGHT_AT must be 0 or more", validation: (n) => n >= 0 }),
    Config.withDefault(defaults.heapTightAt),
  ),
  adminToken: Config.option(Config.redacted("SWARMGATE_ADMIN_TOKEN")),
})

export const layer = (overrides: Partial<GatewayConfigShape> = {}) =>
  Layer.succeed(GatewayConfig, { ...defaults, ...overrides })

export const layerFromEnv = Layer.effect(
  GatewayConfig,
  Effect.map(config, (c) => ({
    ...c,
    adminToken: Option.filter(c.adminToken, (t) => Redacted.value(t).trim().length > 0),
  })),
)
