/**
 * The HTTP transport against a minimal OpenAI-compatible server written here
 * (not node-sim): what a third-party server receives, and how whatever it
 * answers becomes node events or failures.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Exit, Fiber, Random, Scope, Stream } from "effect"
import * as Dispatcher from "../src/Dispatcher"
import * as HttpTransport from "../src/HttpTransport"
import type { NodeEvent, NodeFailure, NodeRequest } from "../src/NodeTransport"
import * as Presets from "../src/Presets"

type Handler = (req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>) => void

interface TestServer {
  url: string
  /** Bodies and headers received, in order. */
  readonly received: Array<{ body: Record<string, unknown>; headers: IncomingMessage["headers"] }>
  /** Requests (since the last reset) whose connection closed before the response was complete. */
  aborted: number
  generation: number
  connections: number
  handler: Handler
}

let server: Server
let state: TestServer

const sse = (res: ServerResponse) =>
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" })
const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`

/** A well-behaved streaming server: the role chunk, the words, a finish, a usage chunk, [DONE]. */
const streams =
  (words: ReadonlyArray<string>, finish = "stop"): Handler =>
  (_req, res) => {
    sse(res)
    res.write(": a comment some servers send\n\n")
    res.write(chunk({ role: "assistant", content: "" }))
    for (const word of words) res.write(chunk({ content: word }))
    res.write(chunk({}, finish))
    res.write(
      `data: ${JSON.stringify({ id: "x", choices: [], usage: { prompt_tokens: 1, completion_tokens: 999 } })}\n\n`,
    )
    res.end("data: [DONE]\n\n")
  }

beforeAll(async () => {
  state = { url: "", received: [], aborted: 0, generation: 0, connections: 0, handler: streams(["Hello"]) }
  server = createServer((req, res) => {
    const parts: Array<Buffer> = []
    req.on("data", (part: Buffer) => parts.push(part))
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(parts).toString("utf8")) as Record<string, unknown>
      state.received.push({ body, headers: req.headers })
      const generation = state.generation
      res.on("close", () => {
        if (!res.writableFinished && generation === state.generation) state.aborted++
      })
      state.handler(req, res, body)
    })
  })
  server.on("connection", () => {
    state.connections++
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  state.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`
})

afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})

const reset = (handler: Handler) => {
  state.handler = handler
  state.received.length = 0
  state.aborted = 0
  state.generation++
}

const node = (options: Partial<HttpTransport.HttpNodeOptions> = {}) =>
  HttpTransport.make({
    id: "third-party",
    url: state.url,
    models: new Map([["test-prime", "llama-3.1-8b-instruct"]]),
    capacity: 4,
    vision: true,
    apiKey: "node-secret",
    ...options,
  })

const request: NodeRequest = {
  requestId: "req_http",
  model: "llama-3.1-8b-instruct",
  messages: [
    { role: "system", content: "Be brief.", images: [] },
    {
      role: "user",
      content: "What is in this picture?",
      images: [{ url: "data:image/png;base64,iVBORw0KGgo=", mediaType: "image/png", bytes: 8 }],
    },
  ],
  maxTokens: 50,
  jsonMode: true,
  sampling: {
    temperature: 0.4,
    topP: 0.9,
    seed: 7,
    stop: ["\n\n"],
    presencePenalty: 0.1,
    frequencyPenalty: -0.2,
    user: "user-42",
  },
}

const collect = (stream: Stream.Stream<NodeEvent, NodeFailure>) =>
  Effect.map(Stream.runCollect(stream), Chunk.toReadonlyArray)

const live = { timeout: 10_000 }

/** The URL of a port nothing listens on (taken, then released). */
const closedUrl = Effect.promise(
  () =>
    new Promise<string>((resolve) => {
      const probe = createServer()
      probe.listen(0, "127.0.0.1", () => {
        const { port } = probe.address() as AddressInfo
        probe.close(() => resolve(`http://127.0.0.1:${port}`))
      })
    }),
)

describe("HttpTransport", () => {
  it.live(
    "sends an OpenAI streaming request with the node's model name, image parts and every sampling field",
    () =>
      Effect.gen(function* () {
        reset(streams(["Hello"]))
        yield* collect(node().generate(request))
        const [{ body, headers }] = state.received as [TestServer["received"][number]]
        expect(body).toEqual({
          model: "llama-3.1-8b-instruct",
          stream: true,
          max_tokens: 50,
          response_format: { type: "json_object" },
          temperature: 0.4,
          top_p: 0.9,
          seed: 7,
          stop: ["\n\n"],
          presence_penalty: 0.1,
          frequency_penalty: -0.2,
          user: "user-42",
          messages: [
            { role: "system", content: "Be brief." },
            {
              role: "user",
              content: [
                { type: "text", text: "What is in this picture?" },
                { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
              ],
            },
          ],
        })
        expect(headers.authorization).toBe("Bearer node-secret")
        expect(headers["x-request-id"]).toBe("req_http")
        expect(headers.accept).toBe("text/event-stream")
      }),
    live,
  )

  it.live(
    "leaves out sampling fields that were not given",
    () =>
      Effect.gen(function* () {
        reset(streams(["Hi"]))
        yield* collect(
          node({ apiKey: undefined }).generate({
            ...request,
            messages: [{ role: "user", content: "Hi", images: [] }],
            jsonMode: false,
            sampling: {},
          }),
        )
        const [{ body, headers }] = state.received as [TestServer["received"][number]]
        expect(body).toEqual({
          model: "llama-3.1-8b-instruct",
          stream: true,
          max_tokens: 50,
          messages: [{ role: "user", content: "Hi" }],
        })
        expect(headers.authorization).toBeUndefined()
      }),
    live,
  )

  it.live(
    "turns content deltas into Delta events and finish_reason into one Finish, ignoring role, usage and comments",
    () =>
      Effect.gen(function* () {
        reset(streams(["The", " answer", " is", " 42"], "length"))
        expect(yield* collect(node().generate(request))).toEqual([
          { _tag: "Delta", text: "The" },
          { _tag: "Delta", text: " answer" },
          { _tag: "Delta", text: " is" },
          { _tag: "Delta", text: " 42" },
          { _tag: "Finish", reason: "length" },
        ])
      }),
    live,
  )

  it.live(
    "reads valid JSON that is not a chunk (null, a number, a null error) as an event without text",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          sse(res)
          res.write("data: null\n\ndata: 5\n\n")
          res.write(chunk({ content: "still" }))
          res.write(
            `data: ${JSON.stringify({ error: null, choices: [{ delta: { content: " here" } }] })}\n\n`,
          )
          res.end(`${chunk({}, "stop")}data: [DONE]\n\n`)
        })
        expect(yield* collect(node().generate(request))).toEqual([
          { _tag: "Delta", text: "still" },
          { _tag: "Delta", text: " here" },
          { _tag: "Finish", reason: "stop" },
        ])
        reset((_req, res) => {
          res.writeHead(200, { "content-type": "application/json" })
          res.end("null")
        })
        expect(yield* collect(node().generate(request))).toEqual([{ _tag: "Finish", reason: "stop" }])
      }),
    live,
  )

  it.live(
    "does not depend on the process's global undici dispatcher (Node's own fetch may have set an older one)",
    () =>
      Effect.gen(function* () {
        const key = Symbol.for("undici.globalDispatcher.1")
        const global = globalThis as Record<symbol, unknown>
        const saved = global[key]
        global[key] = {
          dispatch: () => {
            throw new Error("the global dispatcher was used")
          },
        }
        reset(streams(["Own", " pool"]))
        const events = yield* Effect.ensuring(
          collect(node().generate(request)),
          Effect.sync(() => {
            global[key] = saved
          }),
        )
        expect(events).toEqual([
          { _tag: "Delta", text: "Own" },
          { _tag: "Delta", text: " pool" },
          { _tag: "Finish", reason: "stop" },
        ])
      }),
    live,
  )

  it.live(
    "decodes events split anywhere across network chunks",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          sse(res)
          const text = `${chunk({ content: "Über" })}${chunk({ content: "µ" })}${chunk({}, "stop")}data: [DONE]\n\n`
          const bytes = Buffer.from(text)
          let at = 0
          const next = () => {
            if (at >= bytes.length) return res.end()
            res.write(bytes.subarray(at, at + 7))
            at += 7
            setImmediate(next)
          }
          next()
        })
        expect(yield* collect(node().generate(request))).toEqual([
          { _tag: "Delta", text: "Über" },
          { _tag: "Delta", text: "µ" },
          { _tag: "Finish", reason: "stop" },
        ])
      }),
    live,
  )

  it.live(
    "accepts a server that ignores stream: true and answers one JSON body",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          res.writeHead(200, { "content-type": "application/json" })
          res.end(
            JSON.stringify({
              choices: [{ message: { role: "assistant", content: "All at once" }, finish_reason: "stop" }],
            }),
          )
        })
        expect(yield* collect(node().generate(request))).toEqual([
          { _tag: "Delta", text: "All at once" },
          { _tag: "Finish", reason: "stop" },
        ])
      }),
    live,
  )

  it.live(
    "maps HTTP errors, error events, truncated and broken streams to NodeFailure with a reason",
    () =>
      Effect.gen(function* () {
        const failureOf = (handler: Handler) =>
          Effect.gen(function* () {
            reset(handler)
            const seen: Array<NodeEvent> = []
            const failure = yield* Effect.flip(
              Stream.runForEach(node().generate(request), (e) => Effect.sync(() => seen.push(e))),
            )
            return { failure, seen }
          })
        const overloaded = yield* failureOf((_req, res) => {
          res.writeHead(503, { "content-type": "application/json" })
          res.end('{"error":{"message":"overloaded"}}')
        })
        expect(overloaded.failure.nodeId).toBe("third-party")
        expect(overloaded.failure.reason).toMatch(/^http_503: .*overloaded/)

        const errorEvent = yield* failureOf((_req, res) => {
          sse(res)
          res.write(chunk({ content: "Partial" }))
          res.end(`data: ${JSON.stringify({ error: { message: "CUDA out of memory" } })}\n\n`)
        })
        expect(errorEvent.seen).toEqual([{ _tag: "Delta", text: "Partial" }])
        expect(errorEvent.failure.reason).toBe("node_error: CUDA out of memory")

        const truncated = yield* failureOf((_req, res) => {
          sse(res)
          res.end(chunk({ content: "Cut" }))
        })
        expect(truncated.failure.reason).toMatch(/^truncated/)

        const broken = yield* failureOf((_req, res) => {
          sse(res)
          res.write(chunk({ content: "Then" }))
          setTimeout(() => res.destroy(), 20)
        })
        expect(broken.seen).toEqual([{ _tag: "Delta", text: "Then" }])
        expect(broken.failure.reason).toMatch(/^(broken|truncated)/)

        const garbage = yield* failureOf((_req, res) => {
          sse(res)
          res.end("data: {not json\n\n")
        })
        expect(garbage.failure.reason).toMatch(/^bad_event/)
      }),
    live,
  )

  it.live(
    "an unreachable node fails at once; a server that never answers fails at the connect timeout",
    () =>
      Effect.gen(function* () {
        const closed = HttpTransport.make({
          id: "gone",
          url: yield* closedUrl,
          models: new Map(),
          capacity: 1,
        })
        expect((yield* Effect.flip(collect(closed.generate(request)))).reason).toBe(
          "unreachable: ECONNREFUSED",
        )
        reset(() => {})
        const started = Date.now()
        const failure = yield* Effect.flip(collect(node({ connectTimeoutMillis: 200 }).generate(request)))
        expect(failure.reason).toMatch(/^timeout/)
        expect(Date.now() - started).toBeLessThan(2_000)
      }),
    live,
  )

  it.live(
    "a stream silent for idleTimeoutMillis fails as stalled and the request is aborted",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          sse(res)
          res.write(chunk({ content: "Then" }))
          // ...nothing more, and the connection stays open.
        })
        const started = Date.now()
        const failure = yield* Effect.flip(collect(node().generate({ ...request, idleTimeoutMillis: 200 })))
        expect(failure.reason).toBe("stalled")
        expect(Date.now() - started).toBeLessThan(2_000)
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 100)))
        expect(state.aborted).toBe(1)
      }),
    live,
  )

  it.live(
    "the idle limit runs from each wait: tokens closer than it never stall, however long the stream",
    () =>
      Effect.gen(function* () {
        const words = ["One", " two", " three", " four", " five", " six", " seven"]
        reset((_req, res) => {
          sse(res)
          let i = 0
          const timer = setInterval(() => {
            if (i < words.length) return void res.write(chunk({ content: words[i++] }))
            clearInterval(timer)
            res.write(chunk({}, "stop"))
            res.end("data: [DONE]\n\n")
          }, 120)
        })
        // Seven gaps of 120 ms: the stream outlasts its 300 ms idle limit three times over.
        const events = yield* collect(node().generate({ ...request, idleTimeoutMillis: 300 }))
        expect(
          events.filter((e) => e._tag === "Delta").map((e) => (e._tag === "Delta" ? e.text : "")),
        ).toEqual(words)
        // And a silence after such tokens still stalls.
        reset((_req, res) => {
          sse(res)
          let i = 0
          const timer = setInterval(() => {
            if (i < 4) return void res.write(chunk({ content: words[i++] }))
            clearInterval(timer)
          }, 120)
        })
        const failure = yield* Effect.flip(collect(node().generate({ ...request, idleTimeoutMillis: 300 })))
        expect(failure.reason).toBe("stalled")
      }),
    live,
  )

  it.live(
    "an endless SSE line fails as bad_event after a bounded read, not an unbounded buffer",
    () =>
      Effect.gen(function* () {
        let sent = 0
        reset((_req, res) => {
          sse(res)
          res.write("data: ")
          const block = "x".repeat(64 * 1024)
          const timer = setInterval(() => {
            // Stops by itself at 64 MiB, far past the bound, if the client never gives up.
            if (sent > 64 * 1024 * 1024) return clearInterval(timer)
            sent += block.length
            res.write(block)
          }, 1)
          res.on("close", () => clearInterval(timer))
        })
        const failure = yield* Effect.flip(collect(node().generate(request)))
        expect(failure.reason).toMatch(/^bad_event: an event longer than/)
        expect(sent).toBeLessThan(HttpTransport.MAX_EVENT_CHARS + 16 * 1024 * 1024)
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 100)))
        expect(state.aborted).toBe(1)
      }),
    live,
  )

  it.live(
    "cancelling the consumer aborts the HTTP request, so the server stops",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          sse(res)
          res.write(chunk({ content: "Still" }))
          // Keeps generating until told to stop.
          const timer = setInterval(() => res.write(chunk({ content: " going" })), 10)
          res.on("close", () => clearInterval(timer))
        })
        const firstSeen = yield* Effect.makeLatch(false)
        const fiber = yield* Effect.fork(Stream.runForEach(node().generate(request), () => firstSeen.open))
        yield* firstSeen.await
        yield* Fiber.interrupt(fiber)
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 100)))
        expect(state.aborted).toBe(1)
      }),
    live,
  )

  it.live(
    "reuses one kept-alive connection for requests read to their end",
    () =>
      Effect.gen(function* () {
        reset(streams(["a", "b"]))
        const before = state.connections
        for (let i = 0; i < 5; i++) yield* collect(node().generate(request))
        expect(state.connections - before).toBeLessThanOrEqual(1)
      }),
    live,
  )

  it.live(
    "probe: a one-token request that succeeds when the server works",
    () =>
      Effect.gen(function* () {
        reset(streams(["p"]))
        yield* node().probe!
        expect(state.received[0]!.body).toMatchObject({ model: "llama-3.1-8b-instruct", max_tokens: 1 })
        reset((_req, res) => {
          res.writeHead(500)
          res.end()
        })
        expect((yield* Effect.flip(node().probe!)).reason).toMatch(/^http_500/)
      }),
    live,
  )

  it.live("fromSpec builds a node from a nodes-file entry", () =>
    Effect.sync(() => {
      const built = HttpTransport.fromSpec({
        id: "gpu-1",
        url: "http://10.0.0.5:8000",
        models: { "test-prime": "qwen2.5-7b" },
        capacity: 8,
        vision: true,
      })
      expect(built).toMatchObject({ id: "gpu-1", url: "http://10.0.0.5:8000", capacity: 8, vision: true })
      expect([...built.models]).toEqual([["test-prime", "qwen2.5-7b"]])
    }),
  )
})

describe("HTTP nodes through the dispatcher", () => {
  const presets = Presets.defaultPresets("test").map(
    (preset): Presets.Preset => ({ ...preset, strategy: "single" }),
  )

  it.live(
    "a node failing before its first token is replaced by a working one, and its circuit opens",
    () =>
      Effect.gen(function* () {
        reset(streams(["Fine"]))
        const broken = HttpTransport.make({
          id: "broken",
          url: yield* closedUrl,
          models: new Map([["test-prime", "m"]]),
          capacity: 100,
          vision: true,
        })
        const working = node({ capacity: 1 })
        const dispatcher = Dispatcher.make(presets, [broken, working])
        for (let i = 0; i < 6; i++) {
          const text = yield* Effect.scoped(
            Effect.flatMap(dispatcher.run(presets[0]!, request), (run) =>
              Effect.map(collect(run.events), (events) =>
                events.map((e) => (e._tag === "Delta" ? e.text : "")).join(""),
              ),
            ),
          )
          expect(text).toBe("Fine")
        }
        const status = yield* dispatcher.status
        const brokenStatus = status.find((n) => n.id === "broken")!
        expect(brokenStatus.circuit).toBe("open")
        expect(brokenStatus.failures).toBe(3)
        expect(brokenStatus.lastFailure).toBe("unreachable: ECONNREFUSED")
        expect(status.find((n) => n.id === "third-party")!.requests).toBe(6)
      }).pipe(Effect.withRandom(Random.make("http"))),
    live,
  )

  it.live(
    "closing the caller's scope mid-stream aborts the node's request and frees its slot",
    () =>
      Effect.gen(function* () {
        reset((_req, res) => {
          sse(res)
          res.write(chunk({ content: "Long" }))
          const timer = setInterval(() => res.write(chunk({ content: " answer" })), 10)
          res.on("close", () => clearInterval(timer))
        })
        const dispatcher = Dispatcher.make(presets, [node()])
        const scope = yield* Scope.make()
        const run = yield* Scope.extend(dispatcher.run(presets[0]!, request), scope)
        expect(dispatcher.inFlight("third-party")).toBe(1)
        yield* Stream.runDrain(Stream.take(run.events, 3))
        yield* Scope.close(scope, Exit.void)
        expect(dispatcher.inFlight("third-party")).toBe(0)
        yield* Effect.promise(() => new Promise((r) => setTimeout(r, 100)))
        expect(state.aborted).toBe(1)
      }),
    live,
  )
})
