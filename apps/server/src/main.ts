import { NodeRuntime } from "@effect/platform-node"
import { HttpServer } from "@swarmgate/gateway"
import { Effect, Layer, Logger, LogLevel } from "effect"
import { runCli } from "./Cli"
import { AuthLive, GatewayLive } from "./Layers"
import { serverConfig } from "./ServerConfig"

const logLevel = (process.env.LOG_LEVEL ?? "info").toLowerCase()
const level = LogLevel.allLevels.find((l) => l.label.toLowerCase() === logLevel) ?? LogLevel.Info

const serve = Effect.gen(function* () {
  const config = yield* serverConfig
  const { host, port } = yield* HttpServer.listen({
    port: config.port,
    host: config.host,
    drainMillis: config.drainMillis,
  })
  yield* Effect.logInfo(`swarmgate listening on http://${host}:${port}`)
  // Machine-readable for tests and scripts that start the server on port 0.
  console.log(JSON.stringify({ event: "listening", host, port }))
  return yield* Effect.never
}).pipe(Effect.scoped, Effect.provide(GatewayLive))

const [command = "serve", ...rest] = process.argv.slice(2)

const program =
  command === "serve" ? serve : runCli([command, ...rest]).pipe(Effect.provide(AuthLive), Effect.asVoid)

NodeRuntime.runMain(program.pipe(Logger.withMinimumLogLevel(level), Effect.provide(Layer.empty)), {
  disableErrorReporting: command !== "serve",
})
