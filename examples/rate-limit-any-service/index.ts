/**
 * A thumbnail service that is not swarmgate, rate-limited per user with
 * @swarmgate/quota and its Redis store: every process started with the same
 * REDIS_URL and QUOTA_PREFIX enforces one limit together.
 *
 *   REDIS_URL=redis://127.0.0.1:6379 PORT=3000 node --import tsx examples/rate-limit-any-service/index.ts
 *   curl -i 'http://127.0.0.1:3000/thumbnail?user=alice'
 */
import { createServer } from "node:http"
import { Quota } from "@swarmgate/quota"
import { Effect, Either, ManagedRuntime } from "effect"

/** Per user: 3 thumbnails per 10 seconds (all 3 at once after a pause), and one at a time. */
const limits: Quota.Limits = {
  rates: [{ name: "thumbnails per 10 s", limit: 3, periodMillis: 10_000 }],
  concurrency: { limit: 1, queue: 0 },
}

const runtime = ManagedRuntime.make(
  Quota.layerRedis({
    url: process.env.REDIS_URL ?? "redis://127.0.0.1:6379",
    prefix: process.env.QUOTA_PREFIX ?? "thumbnails:",
  }),
)

const render = (user: string) =>
  Effect.scoped(
    Effect.gen(function* () {
      const permit = yield* Quota.admit({ subject: user, limits })
      // Committed only once the work really starts: a failure before here would cost the user nothing.
      yield* permit.commit
      yield* Effect.sleep(300)
      return { user, thumbnail: `${user}.png`, bytes: 1024 + user.length }
    }),
  )

const log = (event: Record<string, unknown>) => console.log(JSON.stringify(event))

const server = createServer((req, res) => {
  const url = new URL(req.url ?? "/", "http://localhost")
  if (url.pathname !== "/thumbnail") {
    res.writeHead(404).end()
    return
  }
  const user = url.searchParams.get("user") ?? "anonymous"
  runtime.runPromise(Effect.either(render(user))).then(
    (result) => {
      if (Either.isRight(result)) {
        log({ event: "request", user, status: 200 })
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(result.right))
        return
      }
      // Every refusal knows its status and, when retrying helps, its Retry-After in seconds.
      const error = result.left
      log({ event: "request", user, status: error.status, code: error.code, retry_after: error.retryAfter })
      res
        .writeHead(error.status, {
          "content-type": "application/json",
          ...(error.retryAfter === undefined ? {} : { "retry-after": String(error.retryAfter) }),
        })
        .end(JSON.stringify({ error: { code: error.code, message: error.message } }))
    },
    () => res.writeHead(500).end(),
  )
})

server.listen(Number(process.env.PORT ?? 3000), "127.0.0.1", () => {
  const address = server.address()
  log({ event: "listening", port: typeof address === "object" && address !== null ? address.port : null })
})

process.once("SIGTERM", () => {
  server.close()
  server.closeAllConnections()
  void runtime.dispose().then(() => process.exit(0))
})
