/**
 * Two gateway processes sharing one SQLite file and one Redis key prefix: for
 * the tests of what must hold across instances (limits, revocation). Without
 * `TEST_REDIS_URL` those suites skip, unless `SWARMGATE_REQUIRE_SERVICES=1`.
 */
import { randomBytes } from "node:crypto"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll } from "@effect/vitest"
import { RedisStore } from "@swarmgate/quota"
import { Effect } from "effect"
import { type RunningServer, startServer } from "./ServerProcess"

export const redisUrl = process.env.TEST_REDIS_URL
/** Skip the suite: no Redis, and the services are not required. */
export const pairSkipped = redisUrl === undefined && process.env.SWARMGATE_REQUIRE_SERVICES !== "1"

/**
 * Registers the `beforeAll` that starts the pair (one after the other: the
 * first runs the migrations) and hands it to `use`, and the `afterAll` that
 * stops it and removes its database file and Redis keys.
 */
export const usePair = (
  name: string,
  env: Readonly<Record<string, string>>,
  use: (a: RunningServer, b: RunningServer) => void,
) => {
  const prefix = `test:${name}:${randomBytes(6).toString("hex")}:`
  const dir = mkdtempSync(join(tmpdir(), `swarmgate-${name}-`))
  let servers: Array<RunningServer> = []

  beforeAll(async () => {
    if (redisUrl === undefined) throw new Error("TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)")
    const shared = {
      REDIS_URL: redisUrl,
      SWARMGATE_REDIS_PREFIX: prefix,
      SWARMGATE_SIM_SPEED: "1",
      DATABASE_URL: `sqlite:${join(dir, "shared.db")}`,
      ...env,
    }
    const a = await startServer(shared)
    servers = [a]
    const b = await startServer(shared)
    servers = [a, b]
    use(a, b)
  }, 60_000)

  afterAll(async () => {
    await Promise.all(servers.map((server) => server.stop()))
    rmSync(dir, { recursive: true, force: true })
    if (redisUrl !== undefined) await Effect.runPromise(RedisStore.reset({ url: redisUrl, prefix }))
  }, 30_000)
}
