/**
 * Redis for tests: `TEST_REDIS_URL`, or a visible skip (a failure when
 * `SWARMGATE_REQUIRE_SERVICES=1`). Each suite gets a random key prefix and
 * deletes its keys at the end.
 */
import { randomBytes } from "node:crypto"
import { Effect } from "effect"
import { Redis } from "ioredis"
import * as RedisStore from "../../src/stores/Redis"

export const redisUrl = process.env.TEST_REDIS_URL
export const servicesRequired = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
export const skipRedis = redisUrl === undefined && !servicesRequired

export const requireRedis = (suite: string): string => {
  if (redisUrl === undefined)
    throw new Error(`${suite}: TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)`)
  return redisUrl
}

export const warnIfSkipped = (suite: string) => {
  if (skipRedis) console.warn(`[skip] ${suite}: TEST_REDIS_URL is not set, so the Redis tests do not run`)
}

export const randomPrefix = (suite: string) => `test:${suite}:${randomBytes(6).toString("hex")}:`

/** Deletes every key under `prefix`. */
export const deleteKeys = (url: string, prefix: string) =>
  Effect.runPromise(RedisStore.reset({ url, prefix }))

/** Keys under `prefix` that would never expire (a leak), and how many keys there are. */
export const expiryReport = async (url: string, prefix: string) => {
  const redis = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  try {
    await redis.connect()
    let cursor = "0"
    const keys: Array<string> = []
    do {
      const [next, batch] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 500)
      cursor = next
      keys.push(...batch)
    } while (cursor !== "0")
    const forever: Array<string> = []
    for (const key of keys) if ((await redis.pttl(key)) < 0) forever.push(key)
    return { keys, forever }
  } finally {
    redis.disconnect()
  }
}
