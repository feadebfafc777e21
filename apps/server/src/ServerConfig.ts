/**
 * Process-level configuration from the environment (README: Configuration).
 */
import { Config } from "effect"

export const serverConfig = Config.all({
  // Port 0 (any free port) is allowed, unlike Config.port.
  port: Config.integer("PORT").pipe(
    Config.validate({ message: "PORT must be 0-65535", validation: (p) => p >= 0 && p <= 65535 }),
    Config.withDefault(8080),
  ),
  host: Config.string("HOST").pipe(Config.withDefault("127.0.0.1")),
  brand: Config.string("SWARMGATE_BRAND").pipe(Config.withDefault("swarm")),
  /** How long SIGTERM waits for in-flight requests before closing their connections. */
  drainMillis: Config.integer("SWARMGATE_DRAIN_MS").pipe(Config.withDefault(10_000)),
})
