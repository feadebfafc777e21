/**
 * The embedded default assembled from layers: SQLite (or PostgreSQL) for
 * accounts and keys, the simulated swarm, the gateway's HTTP surface.
 */
import { ApiKeys, Repository } from "@swarmgate/auth"
import { Dispatcher, Presets, SimTransport } from "@swarmgate/dispatch"
import { GatewayConfig } from "@swarmgate/gateway"
import { Database } from "@swarmgate/store"
import { Effect, Layer } from "effect"
import { serverConfig } from "./ServerConfig"

export const StoreLive = Repository.layer.pipe(Layer.provideMerge(Database.layerConfig))

export const AuthLive = ApiKeys.layer().pipe(Layer.provideMerge(StoreLive))

export const SwarmLive = Layer.unwrapEffect(
  Effect.map(serverConfig, (config) => {
    const presets = Presets.defaultPresets(config.brand)
    const nodes = SimTransport.makeSimSwarm(
      { seed: config.simSeed, count: config.simNodes, speed: config.simSpeed },
      presets,
    )
    return Dispatcher.layer(presets, nodes)
  }),
)

export const GatewayLive = Layer.mergeAll(AuthLive, SwarmLive, GatewayConfig.layerFromEnv)
