/**
 * The swarm behind the gateway, from the environment: presets (with
 * `SWARMGATE_PRESETS` overrides), HTTP nodes from `SWARMGATE_NODES_FILE`,
 * simulated nodes (the default, or alongside the file when
 * `SWARMGATE_SIM_NODES` asks for them), and the dispatcher's limits.
 */
import { Dispatcher, HttpTransport, NodesFile, Presets, SimTransport } from "@swarmgate/dispatch"
import { Config, ConfigError, Effect, Either, Layer, Option } from "effect"

const millis = (name: string, fallback: number) =>
  Config.integer(name).pipe(
    Config.validate({ message: `${name} must be 0 or more`, validation: (v) => v >= 0 }),
    Config.withDefault(fallback),
  )

export const swarmConfig = Config.all({
  brand: Config.string("SWARMGATE_BRAND").pipe(Config.withDefault("swarm")),
  nodesFile: Config.option(Config.string("SWARMGATE_NODES_FILE")),
  simNodes: Config.option(Config.integer("SWARMGATE_SIM_NODES")),
  simSeed: Config.integer("SWARMGATE_SIM_SEED").pipe(Config.withDefault(42)),
  simSpeed: Config.number("SWARMGATE_SIM_SPEED").pipe(Config.withDefault(1)),
  presets: Config.option(Config.string("SWARMGATE_PRESETS")),
  maxAttempts: Config.integer("SWARMGATE_DISPATCH_ATTEMPTS").pipe(Config.withDefault(3)),
  queueWaitMillis: millis("SWARMGATE_DISPATCH_QUEUE_MS", 1_000),
  queueMax: Config.integer("SWARMGATE_DISPATCH_QUEUE_MAX").pipe(Config.withDefault(256)),
  hedgeAfterMillis: millis("SWARMGATE_HEDGE_MS", 1_000),
  firstTokenTimeoutMillis: millis("SWARMGATE_FIRST_TOKEN_TIMEOUT_MS", 30_000),
  idleTimeoutMillis: millis("SWARMGATE_IDLE_TIMEOUT_MS", 30_000),
  probeIntervalMillis: millis("SWARMGATE_PROBE_INTERVAL_MS", 5_000),
  circuitOpenMillis: millis("SWARMGATE_CIRCUIT_OPEN_MS", 5_000),
  registrationTtlMillis: millis("SWARMGATE_NODE_TTL_MS", 30_000),
  connectTimeoutMillis: millis("SWARMGATE_NODE_CONNECT_TIMEOUT_MS", 10_000),
})

const invalid = (path: string, message: string) => ConfigError.InvalidData([path], message)

export const makeSwarm = Effect.gen(function* () {
  const config = yield* swarmConfig
  let presets = Presets.defaultPresets(config.brand)
  if (Option.isSome(config.presets)) {
    let json: unknown
    try {
      json = JSON.parse(config.presets.value)
    } catch {
      return yield* Effect.fail(invalid("SWARMGATE_PRESETS", "not JSON"))
    }
    const applied = Presets.applyOverrides(presets, json)
    if (Either.isLeft(applied)) return yield* Effect.fail(invalid("SWARMGATE_PRESETS", applied.left))
    presets = applied.right
  }
  const transport = {
    connectTimeoutMillis: config.connectTimeoutMillis,
    probeTimeoutMillis: config.connectTimeoutMillis,
  }
  const specs = Option.isNone(config.nodesFile)
    ? Either.right([])
    : NodesFile.readNodesFile(config.nodesFile.value)
  if (Either.isLeft(specs)) return yield* Effect.fail(invalid("SWARMGATE_NODES_FILE", specs.left))
  const httpNodes = specs.right.map((spec) => HttpTransport.fromSpec(spec, transport))
  // A nodes file means real nodes: simulated ones only when asked for as well.
  const simCount = Option.getOrElse(config.simNodes, () => (Option.isSome(config.nodesFile) ? 0 : 16))
  const simNodes = SimTransport.makeSimSwarm(
    { seed: config.simSeed, count: simCount, speed: config.simSpeed },
    presets,
  )
  return Dispatcher.layer(presets, [...httpNodes, ...simNodes], {
    maxAttempts: config.maxAttempts,
    queueWaitMillis: config.queueWaitMillis,
    queueMax: config.queueMax,
    hedgeAfterMillis: config.hedgeAfterMillis,
    firstTokenTimeoutMillis: config.firstTokenTimeoutMillis,
    idleTimeoutMillis: config.idleTimeoutMillis,
    probeIntervalMillis: config.probeIntervalMillis,
    registrationTtlMillis: config.registrationTtlMillis,
    health: { openMillis: config.circuitOpenMillis },
    makeNode: (spec) => HttpTransport.fromSpec(spec, transport),
  })
})

export const SwarmLive: Layer.Layer<Dispatcher.Dispatcher, ConfigError.ConfigError> =
  Layer.unwrapEffect(makeSwarm)
