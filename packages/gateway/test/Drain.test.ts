import { createServer, request, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { Drain } from "../src"
import * as RequestRun from "../src/RequestRun"

interface Answer {
  readonly status: number
  readonly body: string
}

const get = (port: number, path: string) =>
  new Promise<Answer>((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path, agent: false }, (res) => {
      let body = ""
      res.setEncoding("utf8")
      res.on("data", (chunk: string) => {
        body += chunk
      })
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on("error", reject)
    req.end()
  })

describe("Drainer", () => {
  it.effect("counts what it follows: a request leaves when its fiber ends, from any place in the list", () =>
    Effect.gen(function* () {
      const drainer = new Drain.Drainer()
      const fibers = Array.from({ length: 5 }, () => Effect.runFork(Effect.never))
      // The count never touches the response: any object stands in.
      const res = {} as never
      for (const [i, fiber] of fibers.entries()) drainer.track(RequestRun.ofFiber(fiber), res, `req_${i}`)
      expect(drainer.inFlight).toBe(5)
      // The middle one, the newest, the oldest, then the rest.
      for (const [i, left] of [
        [2, 4],
        [4, 3],
        [0, 2],
        [1, 1],
        [3, 0],
      ] as const) {
        yield* Fiber.interrupt(fibers[i]!)
        expect(drainer.inFlight).toBe(left)
      }
      // A fiber already over when it is tracked leaves at once.
      drainer.track(RequestRun.ofFiber(fibers[0]!), res, "req_late")
      expect(drainer.inFlight).toBe(0)
    }),
  )

  // Requests /a … /g tracked in that order (/g the newest); the ones named end before the drain.
  // The orders reach every link: the newest then the next newest (`next.prev` kept up to date), a
  // middle one then either neighbour (`prev.next` and `next.prev`).
  for (const ended of [
    ["/g", "/f"],
    ["/c", "/d"],
    ["/c", "/b"],
  ]) {
    it.live(
      `at the deadline, answers with 503 server_draining exactly the requests still running (${ended.join(" then ")} ended)`,
      () =>
        Effect.gen(function* () {
          const drainer = new Drain.Drainer()
          const fibers = new Map<string, Fiber.RuntimeFiber<unknown, unknown>>()
          const server: Server = createServer((req, res) => {
            const fiber = Effect.runFork(Effect.never)
            fibers.set(req.url ?? "", fiber)
            drainer.track(RequestRun.ofFiber(fiber), res, `req_${req.url}`)
          })
          yield* Effect.promise(() => new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve)))
          const port = (server.address() as AddressInfo).port
          const paths = ["/a", "/b", "/c", "/d", "/e", "/f", "/g"]
          const answers: Array<Promise<Answer>> = []
          for (const [i, path] of paths.entries()) {
            answers.push(get(port, path))
            yield* Effect.promise(async () => {
              const deadline = Date.now() + 10_000
              while (drainer.inFlight < i + 1) {
                if (Date.now() > deadline) throw new Error(`${path} was not tracked within 10 s`)
                await new Promise((r) => setTimeout(r, 2))
              }
            })
          }
          for (const path of ended) yield* Fiber.interrupt(fibers.get(path)!)
          expect(drainer.inFlight).toBe(paths.length - ended.length)
          yield* drainer.shutdown(server, 20)
          expect(drainer.inFlight).toBe(0)
          const byPath = yield* Effect.promise(() =>
            Promise.allSettled(answers).then((all) => new Map(all.map((a, i) => [paths[i]!, a]))),
          )
          for (const path of paths.filter((p) => !ended.includes(p))) {
            const answer = byPath.get(path)
            expect(answer?.status, path).toBe("fulfilled")
            const { status, body } = (answer as PromiseFulfilledResult<Answer>).value
            expect(status, path).toBe(503)
            expect(JSON.parse(body).error.code, path).toBe("server_draining")
          }
          // Ended before the drain, they were never answered (nothing here writes to them): the drain
          // left them alone, and their connections closed with the server's.
          for (const path of ended) expect(byPath.get(path)?.status, path).toBe("rejected")
        }),
    )
  }
})
