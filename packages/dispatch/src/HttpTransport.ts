/**
 * Nodes that speak the OpenAI chat-completions protocol over HTTP (llama.cpp
 * server, vLLM, Ollama, SGLang, `apps/node-sim`). The gateway always asks for
 * a stream and counts tokens itself; the node's `usage` is ignored.
 *
 * Connections are pooled and kept alive by the transport's own undici `Agent`,
 * driven by `dispatch` with a handler (no promise, Readable body or abort
 * signal per request; far cheaper than the global `fetch`). A stream the consumer
 * abandons (client gone, hedge lost, cap reached) aborts its HTTP request, so
 * the node stops generating; a stream read to its end leaves the connection
 * for the next request.
 */
import { Chunk, Duration, Effect, Exit, Option, Scope, Stream } from "effect"
import { constVoid } from "effect/Function"
import { Agent, type Dispatcher } from "undici"
import { ChunkShapes } from "./ChunkShapes"
import type { NodeSpec } from "./NodesFile"
import {
  generateFromOpen,
  type NodeEvent,
  NodeFailure,
  type NodeMessage,
  type NodeNext,
  type NodePull,
  type NodeRequest,
  type NodeStart,
  type SwarmNode,
} from "./NodeTransport"
import { finishOf, MAX_ERROR_BODY, MAX_EVENT_CHARS, SseBody } from "./SseBody"
import * as Timers from "./Timers"

export { MAX_EVENT_CHARS } from "./SseBody"

export interface HttpNodeOptions {
  readonly id: string
  /** Base URL; requests go to `{url}/v1/chat/completions`. */
  readonly url: string
  /** Preset id → the node's own model name. */
  readonly models: ReadonlyMap<string, string>
  readonly capacity: number
  readonly vision?: boolean | undefined
  readonly apiKey?: string | undefined
  /** The response headers must arrive within this long (default 10 s). */
  readonly connectTimeoutMillis?: number | undefined
  /** A health probe must complete within this long (default 5 s). */
  readonly probeTimeoutMillis?: number | undefined
}

export const fromSpec = (
  spec: NodeSpec,
  options: Pick<HttpNodeOptions, "connectTimeoutMillis" | "probeTimeoutMillis"> = {},
): SwarmNode =>
  make({
    ...options,
    id: spec.id,
    url: spec.url,
    models: new Map(Object.entries(spec.models)),
    capacity: spec.capacity,
    vision: spec.vision,
    apiKey: spec.api_key,
  })

const messageJson = (message: NodeMessage) =>
  message.images.length === 0
    ? { role: message.role, content: message.content }
    : {
        role: message.role,
        content: [
          ...(message.content.length > 0 ? [{ type: "text", text: message.content }] : []),
          ...message.images.map((image) => ({ type: "image_url", image_url: { url: image.url } })),
        ],
      }

/** The JSON body sent to the node: its own model name, the messages, the cap and the sampling fields. */
export const requestBody = (request: NodeRequest): Record<string, unknown> => {
  const { sampling } = request
  const body: Record<string, unknown> = {
    model: request.model,
    messages: request.messages.map(messageJson),
    stream: true,
    max_tokens: request.maxTokens,
  }
  if (request.jsonMode) body.response_format = { type: "json_object" }
  if (sampling.temperature !== undefined) body.temperature = sampling.temperature
  if (sampling.topP !== undefined) body.top_p = sampling.topP
  if (sampling.seed !== undefined) body.seed = sampling.seed
  if (sampling.stop !== undefined && sampling.stop.length > 0) body.stop = sampling.stop
  if (sampling.presencePenalty !== undefined) body.presence_penalty = sampling.presencePenalty
  if (sampling.frequencyPenalty !== undefined) body.frequency_penalty = sampling.frequencyPenalty
  if (sampling.user !== undefined) body.user = sampling.user
  return body
}

/** Socket errors carry a `code` (`ECONNREFUSED`, `UND_ERR_SOCKET`, …), sometimes on their cause. */
const describe = (error: unknown): string => {
  const own = error as { code?: string; cause?: { code?: string; message?: string } } | undefined
  if (typeof own?.code === "string" && own.code !== "UND_ERR_ABORTED") return own.code
  const cause = own?.cause
  if (cause?.code !== undefined) return cause.code
  if (cause?.message !== undefined) return cause.message
  return error instanceof Error ? error.message : String(error)
}

/** A non-streamed answer larger than this is refused (`bad_body`). */
const MAX_JSON_BODY_BYTES = 16 * 1024 * 1024
/** Bytes read but not yet pulled above which the socket is paused: a slow consumer slows the node. */
const HIGH_WATER_BYTES = 64 * 1024

/** A non-streamed answer, as far as it is read. */
interface ChoiceChunk {
  readonly choices?: ReadonlyArray<{
    readonly message?: { readonly content?: unknown } | null
    readonly finish_reason?: unknown
  } | null>
}

const ended: NodePull = Effect.fail(Option.none())
const endedNext: NodeNext = (done) => {
  done(Exit.fail(Option.none()))
  return constVoid
}

/**
 * The connection pools to nodes: our own undici `Agent`, not the global
 * dispatcher, which is whichever undici set it first — Node's built-in one
 * when something called `fetch` before this module loaded, and that older
 * undici does not take the handler `dispatch` is given here.
 */
let agent: Agent | undefined
const nodeAgent = (): Agent => {
  agent ??= new Agent()
  return agent
}

/**
 * A body that is not a stream (an error, or one JSON answer), read up to
 * `limit` bytes and handed to `done` once: whole at its end, cut short when it
 * outgrew the limit or broke off.
 */
class BodyPrefix {
  private readonly parts: Array<Buffer> = []
  private size = 0
  private reported = false
  constructor(
    private readonly limit: number,
    private readonly done: (text: string, whole: boolean) => void,
  ) {}
  /** Adds a read; false (and reported) once the body outgrew the limit. */
  add(bytes: Buffer): boolean {
    if (this.reported) return false
    this.size += bytes.length
    this.parts.push(bytes)
    if (this.size <= this.limit) return true
    this.finish(false)
    return false
  }
  finish(whole: boolean): void {
    if (this.reported) return
    this.reported = true
    this.done(Buffer.concat(this.parts).toString("utf8"), whole)
  }
}

/** One JSON answer (a server that ignored `stream: true`) as the events it stands for. */
const answerOf = (
  text: string,
  failed: (reason: string) => NodeFailure,
): Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> => {
  let parsed: ChoiceChunk | null
  try {
    parsed = JSON.parse(text) as ChoiceChunk | null
  } catch (error) {
    return Exit.fail(Option.some(failed(`bad_body: ${describe(error)}`)))
  }
  // Valid JSON that is not an answer (`null`, a number) is read as an empty one, never thrown on.
  const choice = Array.isArray(parsed?.choices) ? parsed.choices[0] : undefined
  const said = choice?.message?.content
  const content = typeof said === "string" ? said : ""
  const reason = choice?.finish_reason
  const finish: NodeEvent = { _tag: "Finish", reason: finishOf(typeof reason === "string" ? reason : "stop") }
  return Exit.succeed(
    Chunk.unsafeFromArray(content.length > 0 ? [{ _tag: "Delta", text: content }, finish] : [finish]),
  )
}

/**
 * The events of one SSE body, pulled a socket read at a time: each pull
 * returns every event the reads since the last pull completed, so the cost
 * per pull does not grow with the number of events in it.
 */
class EventReader {
  private readonly body: SseBody
  private pending: Array<NodeEvent> = []
  /** Bytes read since the last pull took the pending events. */
  private pendingBytes = 0
  private failure: NodeFailure | undefined
  /** The body ended or failed: nothing more will arrive. */
  private over = false
  private paused = false
  /** The wait in progress (a reader has one at a time), called once with what is ready. */
  private waiting: ((exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void) | undefined
  /** When the wait in progress began: its idle limit runs from there. */
  private waitingSince = 0
  /** The idle check on the shared deadline list, while one is there. */
  private idleCheck: (() => void) | undefined

  constructor(
    private readonly fail: (reason: string) => NodeFailure,
    /** Silence while a pull waits that fails the stream as `stalled` (0: none). */
    private readonly idleMillis: number,
    /** Stops and restarts reading the socket: a slow consumer slows the node. */
    private readonly flow: { readonly pause: () => void; readonly resume: () => void },
    /** The node's chunk shapes, learned by its earlier streams. */
    shapes: ChunkShapes,
  ) {
    this.body = new SseBody(MAX_EVENT_CHARS, shapes)
  }

  /** A socket read of the body. */
  data(bytes: Buffer): void {
    if (this.over || this.failure !== undefined) return
    this.pendingBytes += bytes.length
    const body = this.body
    body.read(bytes, this.pending)
    if (body.failure !== undefined) this.failure = this.fail(body.failure)
    // Only with events waiting for a pull: a long event still arriving must be read to its end.
    if (this.pendingBytes > HIGH_WATER_BYTES && this.pending.length > 0 && !this.paused) {
      this.paused = true
      this.flow.pause()
    }
    if (this.pending.length > 0 || this.failure !== undefined) this.notify()
  }

  /** The body was read to its end. */
  end(): void {
    if (this.over) return
    if (this.failure === undefined) {
      if (this.body.done || this.body.finish !== undefined)
        this.pending.push({ _tag: "Finish", reason: this.body.finish ?? "stop" })
      else this.failure = this.fail("truncated: the stream ended without finish_reason or [DONE]")
    }
    this.over = true
    this.notify()
  }

  /** The body broke off (the node's connection, or our abort). */
  error(error: unknown): void {
    if (this.over) return
    this.over = true
    if (this.failure === undefined) {
      if (this.body.done) this.pending.push({ _tag: "Finish", reason: this.body.finish ?? "stop" })
      else this.failure = this.fail(`broken: ${describe(error)}`)
    }
    this.notify()
  }

  private notify(): void {
    // Nothing more can arrive: no idle check may keep the reader until it falls due.
    if (this.over || this.failure !== undefined) this.dropIdle()
    const done = this.waiting
    if (done === undefined) return
    // Taken before `ready`, whose resume of a paused socket may deliver more data (and notify) at once.
    this.waiting = undefined
    const next = this.ready()
    if (next === undefined) {
      this.waiting = done
      return
    }
    done(next)
  }

  /**
   * One idle check per reader on the shared deadline list, not one per wait:
   * a paced stream waits once per token. When it falls due, a wait that began
   * since is given the rest of its limit.
   */
  private readonly checkIdle = (): void => {
    this.idleCheck = undefined
    const done = this.waiting
    if (done === undefined) return
    if (Date.now() - this.waitingSince < this.idleMillis) {
      this.armIdle()
      return
    }
    this.waiting = undefined
    this.failure ??= this.fail("stalled")
    done(Exit.fail(Option.some(this.failure)))
  }

  private armIdle(): void {
    this.idleCheck = Timers.deadline(this.idleMillis, this.checkIdle, this.waitingSince)
  }

  /** No wait is left to watch (the body is over, or the wait was cancelled): the check leaves the list, which would keep the reader until it fell due. */
  private dropIdle(): void {
    this.idleCheck?.()
    this.idleCheck = undefined
  }

  /**
   * What is ready: events first (the deltas before a failure still count),
   * then the failure, then the end. An `Exit`, which is an Effect too.
   */
  private ready(): Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> | undefined {
    if (this.pending.length > 0) {
      const events = this.pending
      this.pending = []
      this.pendingBytes = 0
      if (this.paused) {
        this.paused = false
        this.flow.resume()
      }
      return Exit.succeed(Chunk.unsafeFromArray(events))
    }
    if (this.failure !== undefined) return Exit.fail(Option.some(this.failure))
    if (this.over) return Exit.fail(Option.none())
    return undefined
  }

  /**
   * Calls `done` once with the first thing ready (as `pull` would return it),
   * by callback: no fiber waits for a node's first events. Returns the cancel.
   */
  next(done: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void): () => void {
    const now = this.ready()
    if (now !== undefined) {
      done(now)
      return constVoid
    }
    this.waiting = done
    if (this.idleMillis > 0) {
      this.waitingSince = Date.now()
      if (this.idleCheck === undefined) this.armIdle()
    }
    return () => {
      if (this.waiting !== done) return
      this.waiting = undefined
      this.dropIdle()
    }
  }

  /** `next` as an Effect: what is ready at once, else one wait (its idle limit on the shared deadline list). */
  readonly pull: Effect.Effect<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> = Effect.suspend(
    () =>
      this.ready() ??
      Effect.async<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>((resume) => {
        const cancel = this.next(resume)
        return Effect.sync(cancel)
      }),
  )
}

export const make = (options: HttpNodeOptions): SwarmNode => {
  const { id } = options
  const endpoint = new URL(`${options.url.replace(/\/+$/, "")}/v1/chat/completions`)
  const origin = endpoint.origin
  const path = `${endpoint.pathname}${endpoint.search}`
  const connectTimeoutMillis = options.connectTimeoutMillis ?? 10_000
  const authorization = options.apiKey === undefined ? undefined : `Bearer ${options.apiKey}`
  // Each request's headers as one literal: V8 gives each copy made by `{ ...headers, id }` a hidden
  // class of its own, ~0.8 µs and a promotion (docs/ARCHITECTURE.md, "Object spread").
  const headersFor = (requestId: string): Record<string, string> =>
    authorization === undefined
      ? { "content-type": "application/json", accept: "text/event-stream", "x-request-id": requestId }
      : {
          "content-type": "application/json",
          accept: "text/event-stream",
          authorization,
          "x-request-id": requestId,
        }
  const failure = (reason: string) => new NodeFailure({ nodeId: id, reason })
  // What this node's chunks look like, learned by its first streams and kept for the rest.
  const shapes = new ChunkShapes()

  /**
   * Sends the request and reports the first events (or the failure) to
   * `onFirst`, all by callback: the dispatcher's attempt needs no fiber. The
   * response head must come within the connect timeout.
   */
  const begin = (
    request: NodeRequest,
    onFirst: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void,
  ): NodeStart => {
    // Set once the body was read to its end: only then may the connection be reused.
    let complete = false
    let stopped = false
    let timedOut = false
    /** Given by undici when the request is sent; until then a stop is applied when it comes. */
    let controller: Dispatcher.DispatchController | undefined
    let rest: NodePull = ended
    let restNext: NodeNext = endedNext
    let cancelWait: () => void = constVoid
    const first = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => {
      if (Exit.isFailure(exit)) {
        rest = exit
        restNext = (done) => {
          done(exit)
          return constVoid
        }
      }
      if (!stopped) onFirst(exit)
    }
    const failed = (reason: string) => first(Exit.fail(Option.some(failure(reason))))
    const abort = () => controller?.abort(new Error("aborted by the gateway"))
    // One shared deadline list for every node request's response head.
    const cancelTimer = Timers.deadline(connectTimeoutMillis, () => {
      timedOut = true
      abort()
      failed(`timeout: no response within ${connectTimeoutMillis} ms`)
    })
    /** What the body is read as, once the head came: an event stream, or a bounded prefix. */
    let reader: EventReader | undefined
    let prefix: BodyPrefix | undefined
    // undici's dispatch with a handler: no promise, no Readable and no signal per request.
    nodeAgent().dispatch(
      {
        origin,
        path,
        method: "POST",
        headers: headersFor(request.requestId),
        body: JSON.stringify(requestBody(request)),
        // The dispatcher owns the idle limit; undici's own would cut long silences at 300 s.
        bodyTimeout: 0,
        headersTimeout: 0,
      },
      {
        onRequestStart: (c) => {
          controller = c
          if (stopped || timedOut) abort()
        },
        onResponseStart: (c, statusCode, responseHeaders) => {
          // The head was read (as `responseHeaders`): the controller, which the reader keeps for
          // pause and resume, need not hold its raw form (a buffer per name and value) while the
          // answer streams.
          c.rawHeaders = null
          if (timedOut) return
          cancelTimer()
          if (statusCode < 200 || statusCode > 299) {
            prefix = new BodyPrefix(MAX_ERROR_BODY, (text) =>
              failed(`http_${statusCode}: ${text.slice(0, MAX_ERROR_BODY)}`),
            )
            return
          }
          const type = String(responseHeaders["content-type"] ?? "")
          if (!type.includes("text/event-stream")) {
            // A server that ignored `stream: true` and answered with one JSON body.
            prefix = new BodyPrefix(MAX_JSON_BODY_BYTES, (text, whole) =>
              whole
                ? first(answerOf(text, failure))
                : failed("bad_body: the answer is too large or broke off"),
            )
            return
          }
          const events = new EventReader(
            failure,
            request.idleTimeoutMillis ?? 0,
            {
              pause: () => c.pause(),
              resume: () => c.resume(),
            },
            shapes,
          )
          reader = events
          rest = events.pull
          restNext = (done) => events.next(done)
          cancelWait = events.next(first)
        },
        onResponseData: (c, bytes) => {
          if (reader !== undefined) reader.data(bytes)
          // Too large: the rest is dropped with the connection.
          else if (prefix !== undefined && !prefix.add(bytes)) c.abort(new Error("body too large"))
        },
        onResponseEnd: () => {
          complete = true
          if (reader !== undefined) reader.end()
          else prefix?.finish(true)
        },
        onResponseError: (_c, error) => {
          if (reader !== undefined) return reader.error(error)
          if (prefix !== undefined) return prefix.finish(false)
          if (timedOut) return
          cancelTimer()
          failed(`unreachable: ${describe(error)}`)
        },
      },
    )
    return {
      pull: Effect.suspend(() => rest),
      next: (done) => restNext(done),
      stop: () => {
        if (stopped) return
        stopped = true
        cancelTimer()
        cancelWait()
        if (!complete) abort()
      },
    }
  }

  /** The first pull sends the request (so the dispatcher's first-token limit covers it). */
  const open = (request: NodeRequest, scope: Scope.Scope): Effect.Effect<NodePull> => {
    let started: NodeStart | undefined
    const pull: NodePull = Effect.suspend(() =>
      started !== undefined
        ? started.pull
        : Effect.async<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>((resume) => {
            started = begin(request, resume)
          }),
    )
    return Effect.as(
      Scope.addFinalizer(
        scope,
        Effect.sync(() => started?.stop()),
      ),
      pull,
    )
  }

  const generate = generateFromOpen(open)

  const probeModel = options.models.values().next().value ?? "default"
  const probe = Stream.runDrain(
    generate({
      requestId: "probe",
      model: probeModel,
      messages: [{ role: "user", content: "ping", images: [] }],
      maxTokens: 1,
      jsonMode: false,
      sampling: { temperature: 0 },
    }),
  ).pipe(
    Effect.timeoutFail({
      duration: Duration.millis(options.probeTimeoutMillis ?? 5_000),
      onTimeout: () => failure("probe_timeout"),
    }),
  )

  return {
    id,
    url: options.url,
    begin,
    capacity: options.capacity,
    models: options.models,
    vision: options.vision ?? false,
    enforcesIdleTimeout: true,
    generate,
    open,
    probe,
  }
}
