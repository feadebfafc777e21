/**
 * The shared Redis connection: one per URL and timeout in the process, closed
 * with its last user, and commands sent in the same tick leave in one write
 * (what lets a request's admission and hold cost one round trip).
 */
import { createHash } from "node:crypto"
import { describe, expect, it, vi } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import type { Redis as Client } from "ioredis"
import * as Redis from "../src/Redis"

const url = process.env.TEST_REDIS_URL
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
if (url === undefined && !required)
  console.warn("[skip] shared Redis connection: TEST_REDIS_URL is not set, so these tests do not run")

const scriptOf = (source: string) => ({ source, sha: createHash("sha1").update(source).digest("hex") })
const echo = scriptOf("return ARGV[1]")
/** An echo with a source of its own, so no earlier run has loaded it into Redis. */
const unseenScript = () => scriptOf(`return ARGV[1] -- ${crypto.randomUUID()}`)

type Writes = (...args: Array<unknown>) => unknown

/** Counts the writes that reach the client's socket (one `_write` or `_writev` each) while `body` runs. */
const writesDuring = <A, E>(client: Client, body: Effect.Effect<A, E>) =>
  Effect.suspend(() => {
    const stream = (client as unknown as { stream: { _write: Writes; _writev: Writes } }).stream
    const { _write: write, _writev: writev } = stream
    let writes = 0
    stream._write = (...args) => {
      writes++
      return write.apply(stream, args)
    }
    stream._writev = (...args) => {
      writes++
      return writev.apply(stream, args)
    }
    return Effect.map(
      Effect.ensuring(
        body,
        Effect.sync(() => {
          stream._write = write
          stream._writev = writev
        }),
      ),
      (result) => ({ result, writes }),
    )
  })

describe.skipIf(url === undefined && !required)("shared Redis connection", () => {
  const redisUrl = () => {
    if (url === undefined) throw new Error("TEST_REDIS_URL is required (SWARMGATE_REQUIRE_SERVICES=1)")
    return url
  }

  it.live("users of one URL share one client, which closes with the last of them", () =>
    Effect.gen(function* () {
      const first = yield* Scope.make()
      const second = yield* Scope.make()
      const a = yield* Scope.extend(Redis.shared(redisUrl(), 1_000), first)
      const b = yield* Scope.extend(Redis.shared(redisUrl(), 1_000), second)
      expect(b).toBe(a)
      yield* Scope.close(first, Exit.void)
      expect(a.status).toBe("ready")
      expect(yield* Redis.command(() => a.ping())).toBe("PONG")
      yield* Scope.close(second, Exit.void)
      expect((yield* Effect.either(Redis.command(() => a.ping())))._tag).toBe("Left")
      // A new user after the last one left gets a new connection.
      const again = yield* Effect.scoped(
        Effect.flatMap(Redis.shared(redisUrl(), 1_000), (c) => Effect.succeed(c)),
      )
      expect(again).not.toBe(a)
    }),
  )

  it.live("a script Redis does not know (a restart, SCRIPT FLUSH) is sent whole, then run by its SHA", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const client = yield* Redis.shared(redisUrl(), 1_000)
        const script = unseenScript()
        expect(yield* Redis.command(() => client.script("EXISTS", script.sha))).toEqual([0])
        expect(yield* Redis.run(client, script, [], ["first"])).toBe("first")
        expect(yield* Redis.command(() => client.script("EXISTS", script.sha))).toEqual([1])
        expect(yield* Redis.run(client, script, [], ["again"])).toBe("again")
      }),
    ),
  )

  it.live("a script Redis does not know is not sent again once the caller says it no longer applies", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const client = yield* Redis.shared(redisUrl(), 1_000)
        const script = unseenScript()
        const reply = yield* Redis.run(client, script, [], ["late"], undefined, () => false)
        expect(reply).toBeNull()
        expect(yield* Redis.command(() => client.script("EXISTS", script.sha))).toEqual([0])
      }),
    ),
  )

  it.live("a script's error fails the run, as the caller's own error", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const client = yield* Redis.shared(redisUrl(), 1_000)
        const failing = scriptOf("return redis.error_reply('refused by the script')")
        const plain = yield* Effect.flip(Redis.run(client, failing, [], []))
        expect(plain._tag).toBe("RedisFailure")
        expect(plain.reason).toContain("refused by the script")
        const mapped = yield* Effect.flip(
          Redis.run(client, failing, [], [], (f) => ({ _tag: "Mine" as const, reason: f.reason })),
        )
        expect(mapped).toEqual({ _tag: "Mine", reason: expect.stringContaining("refused by the script") })
      }),
    ),
  )

  it.live("scripts run together go out in one write; in turn, one write each", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const client = yield* Redis.shared(redisUrl(), 1_000)
        // Loads the script (the first call falls back to EVAL), so both runs below are EVALSHA.
        yield* Redis.run(client, echo, [], ["warm"])
        const together = yield* writesDuring(
          client,
          Effect.all([Redis.run(client, echo, [], ["a"]), Redis.run(client, echo, [], ["b"])], {
            concurrency: 2,
          }),
        )
        expect(together).toEqual({ result: ["a", "b"], writes: 1 })
        const inTurn = yield* writesDuring(
          client,
          Effect.zip(Redis.run(client, echo, [], ["a"]), Redis.run(client, echo, [], ["b"])),
        )
        expect(inTurn).toEqual({ result: ["a", "b"], writes: 2 })
      }),
    ),
  )

  it.live(
    "a script sent now leaves at the call, with the others sent in that run: one write, no fiber each",
    () =>
      Effect.scoped(
        Effect.gen(function* () {
          const client = yield* Redis.shared(redisUrl(), 1_000)
          yield* Redis.run(client, echo, [], ["warm"])
          const sent = yield* writesDuring(
            client,
            Effect.suspend(() => {
              const a = Redis.sendNow(client, echo, [], ["a"]).wait
              const b = Redis.sendNow(client, echo, [], ["b"]).wait
              // Waited for in any order, and as often as the caller likes: the same reply each time.
              return Effect.all([b, a, a])
            }),
          )
          expect(sent).toEqual({ result: ["b", "a", "a"], writes: 1 })
          // Sent whether or not anything waits for it: a command after it on the connection sees its effect.
          const key = `swarmgate-test:${crypto.randomUUID()}`
          const set = scriptOf("return redis.call('SET', KEYS[1], ARGV[1])")
          yield* Redis.run(client, set, [key], ["loaded"])
          Redis.sendNow(client, set, [key], ["sent"])
          expect(yield* Redis.command(() => client.get(key))).toBe("sent")
          yield* Redis.command(() => client.del(key))
          // A failure reaches each wait as the caller's own error.
          const failing = Redis.sendNow(
            client,
            scriptOf("return redis.error_reply('nope')"),
            [],
            [],
            (f) => f.reason,
          ).wait
          expect(yield* Effect.flip(failing)).toContain("nope")
          expect(yield* Effect.flip(failing)).toContain("nope")
          // Observed by plain calls: an Exit, to every observer (after one that throws too: reported,
          // not the connection's unhandled rejection), at once for one that comes after the reply.
          const observed = Redis.sendNow(client, echo, [], ["seen"])
          const seen: Array<unknown> = []
          const reported = vi.spyOn(console, "error").mockImplementation(() => undefined)
          observed.observe(() => {
            throw new Error("an observer's bug")
          })
          observed.observe((outcome) =>
            seen.push(Exit.isExit(outcome) && Exit.isSuccess(outcome) && outcome.value),
          )
          expect(yield* observed.wait).toBe("seen")
          observed.observe((outcome) =>
            seen.push(Exit.isExit(outcome) && Exit.isSuccess(outcome) && outcome.value),
          )
          expect(seen).toEqual(["seen", "seen"])
          expect(reported).toHaveBeenCalledTimes(1)
          reported.mockRestore()
        }),
      ),
  )
})
