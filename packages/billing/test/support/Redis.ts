/**
 * Redis for the billing tests: `TEST_REDIS_URL`, or a visible skip (a failure
 * when `SWARMGATE_REQUIRE_SERVICES=1`). Each suite gets its own key prefix,
 * deleted when the suite ends.
 */
import { randomBytes } from "node:crypto"
import { afterAll } from "@effect/vitest"
import { Redis } from "ioredis"

export const redisUrl = process.env.TEST_REDIS_URL?.trim() || undefined
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"

export const randomPrefix = (suite: string) => `test:${suite}:${randomBytes(6).toString("hex")}:`

/** Deletes every key under `prefix`. */
export const deleteKeys = async (url: string, prefix: string) => {
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  try {
    await redis.connect()
    let cursor = "0"
    do {
      const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 500)
      cursor = next
      if (keys.length > 0) await redis.unlink(...keys)
    } while (cursor !== "0")
  } finally {
    redis.disconnect()
  }
}

interface Describe {
  (name: string, body: (test: (name: string, body: () => void) => unknown) => void): unknown
  readonly skipIf: (condition: boolean) => (name: string, body: () => void) => unknown
}

/** `describe(name, …)` for a suite that needs Redis: skipped with a warning, or failing when services are required. */
export const describeRedis = (
  describe: Describe,
  name: string,
  body: (url: string, prefix: string) => void,
): void => {
  if (redisUrl === undefined && required) {
    describe(name, (test) => {
      test("needs Redis", () => {
        throw new Error(`${name}: TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)`)
      })
    })
    return
  }
  if (redisUrl === undefined)
    console.warn(`[skipped] ${name}: TEST_REDIS_URL is not set, Redis tests skipped`)
  describe.skipIf(redisUrl === undefined)(name, () => {
    const url = redisUrl ?? ""
    const prefix = randomPrefix("billing")
    afterAll(() => deleteKeys(url, prefix))
    body(url, prefix)
  })
}
