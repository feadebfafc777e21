import { NodeRuntime } from "@effect/platform-node"
import { AdminConfig } from "@swarmgate/admin"
import { HttpServer, RootFibers } from "@swarmgate/gateway"
import { Effect, Layer, Logger, LogLevel } from "effect"
import { runCli } from "./Cli"
import { CliLive, GatewayLive } from "./Layers"
import { serverConfig } from "./ServerConfig"

// Accepts Effect's level names and the common synonyms (warning, none).
const synonyms: Record<string, string> = { warning: "warn", none: "off", silent: "off" }
const requested = (process.env.LOG_LEVEL ?? "info").toLowerCase()
const logLevel = synonyms[requested] ?? requested
const level = LogLevel.allLevels.find((l) => l.label.toLowerCase() === logLevel) ?? LogLevel.Info

const serve = Effect.gen(function* () {
  const config = yield* serverConfig
  const { host, port } = yield* HttpServer.listen({
    port: config.port,
    host: config.host,
    drainMillis: config.drainMillis,
  })
  // Links in mail point here unless SWARMGATE_PUBLIC_URL says otherwise (the port may have been 0).
  ;(yield* AdminConfig.AdminConfig).listening(host, port)
  yield* Effect.logInfo(`swarmgate listening on http://${host}:${port}`)
  // Machine-readable for tests and scripts that start the server on port 0.
  console.log(JSON.stringify({ event: "listening", host, port }))
  return yield* Effect.never
}).pipe(Effect.scoped, Effect.provide(GatewayLive))

const [command = "serve", ...rest] = process.argv.slice(2)

// One root fiber per request: not kept for `Fiber.roots`, which the server never reads (RootFibers.ts).
if (command === "serve") RootFibers.untrack()

const program =
  command === "serve" ? serve : runCli([command, ...rest]).pipe(Effect.provide(CliLive), Effect.asVoid)

// The server logs JSON lines (request lines are JSON too: see RequestLog.ts); the CLI keeps the pretty logger.
NodeRuntime.runMain(
  program.pipe(
    Logger.withMinimumLogLevel(level),
    Effect.provide(command === "serve" ? Logger.json : Layer.empty),
  ),
  { disableErrorReporting: command !== "serve", disablePrettyLogger: command === "serve" },
)
