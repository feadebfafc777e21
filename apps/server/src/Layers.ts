/**
 * The embedded default assembled from layers: SQLite (or PostgreSQL) for
 * accounts and keys, the simulated swarm, the gateway's HTTP surface. With
 * `REDIS_URL`, everything instances must agree on moves to Redis: limits,
 * the billing book, key invalidation and node registrations.
 */
import { AdminConfig, AdminHttp, Mail } from "@swarmgate/admin"
import { ApiKeys, InvalidationBus, Repository } from "@swarmgate/auth"
import { Billing, RedisBilling } from "@swarmgate/billing"
import { type Dispatcher, Presets } from "@swarmgate/dispatch"
import { GatewayConfig, Health, Limits, Metrics, NodeRegistry, type SideRoutes } from "@swarmgate/gateway"
import type { Quota } from "@swarmgate/quota"
import { Database } from "@swarmgate/store"
import { Config, type ConfigError, Effect, Layer, Option, Redacted } from "effect"
import { serverConfig } from "./ServerConfig"
import * as Swarm from "./Swarm"

export const StoreLive = Repository.layer.pipe(Layer.provideMerge(Database.layerConfig))

/** `REDIS_URL` (when set and not empty) with the prefix and lease shared with the limiter. */
const sharedRedis = Effect.map(Limits.storeConfig, (store) =>
  Option.map(
    Option.filter(store.redisUrl, (url) => Redacted.value(url).trim().length > 0),
    (url) => ({
      url,
      prefix: store.prefix,
      leaseMillis: store.leaseMillis,
      onRedisFailure: store.onStoreFailure,
    }),
  ),
)

/** Keys, with changes announced to every instance over Redis when it is configured (the CLI too). */
export const AuthLive = Layer.unwrapEffect(
  Effect.map(sharedRedis, (redis) =>
    Option.match(redis, {
      onNone: () => ApiKeys.layer(),
      onSome: (shared) => InvalidationBus.layer(shared).pipe(Layer.provide(ApiKeys.layer())),
    }),
  ),
).pipe(Layer.provideMerge(StoreLive))

/**
 * Presets, nodes (nodes file, registrations, simulated) and the dispatcher: see Swarm.ts;
 * registrations shared through Redis when it is configured.
 */
export const SwarmLive: Layer.Layer<Dispatcher.Dispatcher, ConfigError.ConfigError> = Layer.unwrapEffect(
  Effect.map(sharedRedis, (redis) =>
    Option.match(redis, {
      onNone: () => Swarm.SwarmLive,
      onSome: (shared) => NodeRegistry.layer(shared).pipe(Layer.provide(Swarm.SwarmLive)),
    }),
  ),
)

/** Holds and charges for the presets served, over the same database as accounts and keys. */
export const BillingLive = Layer.unwrapEffect(
  Effect.map(Effect.all([serverConfig, sharedRedis]), ([config, redis]) => {
    const models = Presets.defaultPresets(config.brand).map((preset) => preset.id)
    // With Redis the book is shared, so instances cannot jointly overspend; else one instance's memory.
    return Option.match(redis, {
      onNone: () => Billing.layerConfig(models),
      onSome: (shared) => RedisBilling.layerConfig(models, shared),
    })
  }),
).pipe(Layer.provide(StoreLive))

/** Rate limits, quotas and concurrency: in memory, or in Redis when `REDIS_URL` is set. */
export const LimitsLive: Layer.Layer<
  Quota.Quota | Limits.LimitsConfig | Limits.AccountUsage,
  ConfigError.ConfigError
> = Limits.layerFromEnv.pipe(Layer.provide(SwarmLive))

/** `/metrics` (token: `SWARMGATE_METRICS_TOKEN`) and `/readyz` (database, Redis, nodes). */
export const OpsLive = Layer.unwrapEffect(
  Effect.map(
    Effect.all([Config.option(Config.redacted("SWARMGATE_METRICS_TOKEN")), sharedRedis]),
    ([token, redis]) =>
      Health.layer({ redisUrl: Option.map(redis, (shared) => shared.url) }).pipe(
        Layer.provideMerge(Metrics.layer(Option.filter(token, (t) => Redacted.value(t).length > 0))),
      ),
  ),
).pipe(Layer.provide(SwarmLive), Layer.provide(StoreLive))

const ServicesLive = Layer.mergeAll(
  AuthLive,
  SwarmLive,
  GatewayConfig.layerFromEnv,
  BillingLive,
  LimitsLive,
  OpsLive,
)

/** Links in mail, SMTP, the bound on applications: from the environment (`http://HOST:PORT` by default). */
export const AdminConfigLive = Layer.unwrapEffect(
  Effect.map(serverConfig, (config) => AdminConfig.layerFromEnv(`http://${config.host}:${config.port}`)),
)

/** What the CLI runs on: accounts and keys, and mail (SMTP or the outbox) for what it decides. */
export const CliLive = Mail.layer.pipe(Layer.provideMerge(Layer.merge(AuthLive, AdminConfigLive)))

/**
 * Everything the server runs on, with the admin API, the application pages
 * and the console (`@swarmgate/admin`) on the routes outside /v1.
 */
export const GatewayLive: Layer.Layer<
  Layer.Layer.Success<typeof ServicesLive> | SideRoutes.SideRoutes | AdminConfig.AdminConfig,
  Layer.Layer.Error<typeof ServicesLive> | ConfigError.ConfigError
> = AdminHttp.layer.pipe(Layer.provideMerge(Layer.merge(ServicesLive, AdminConfigLive)))
