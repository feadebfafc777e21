/**
 * Runs a normalised request on the swarm and writes the answer: one JSON body
 * or an SSE stream. The gateway counts every token itself and enforces the cap.
 * Failures before the first token are ordinary HTTP errors; after the stream
 * started they become its last event (spec §6).
 */
import type { ServerResponse } from "node:http"
import {
  Dispatcher,
  Finalizers,
  type NodeEvent,
  type NodeFailure,
  type NodeNext,
  type NodePull,
  Timers,
} from "@swarmgate/dispatch"
import {
  type ApiError,
  type CapacityExhausted,
  type FinishReason,
  REQUEST_ID_HEADER,
  renderError,
  streamErrorEvent,
  Tokens,
  UpstreamError,
  UpstreamTimeout,
} from "@swarmgate/protocol"
import { SseEncoder, SseWriter } from "@swarmgate/sse"
import {
  Cause,
  Chunk,
  Context,
  Effect,
  Either,
  Exit,
  FiberId,
  Option,
  type Runtime,
  type Scope,
} from "effect"
import { constVoid } from "effect/Function"
import { GatewayConfig, type GatewayConfigShape } from "./GatewayConfig"
import { flat, flatHeader } from "./internal/Flat"
import { jsonInside } from "./internal/JsonText"
import type { NormalizedRequest } from "./RequestPolicy"

/** What ran, for usage records and billing: set as the request goes. */
export interface Outcome {
  /** True once a node produced its first event: from here on the request counts as run (spec §7.3). */
  started: boolean
  nodeId: string | undefined
  completionTokens: number
  finishReason: FinishReason | undefined
  /** `completed`, or why it ended early: `upstream_error`, `upstream_timeout`, `client_disconnected`. */
  status: "pending" | "completed" | "upstream_error" | "upstream_timeout"
  headersSent: boolean
}

export const newOutcome = (): Outcome => ({
  started: false,
  nodeId: undefined,
  completionTokens: 0,
  finishReason: undefined,
  status: "pending",
  headersSent: false,
})

/** Text gated by the token cap: the part of each delta that may still be sent. */
class CappedText {
  text = ""
  /** UTF-8 bytes of `text`, while nothing was counted. */
  bytes = 0
  tokens = 0
  capped = false
  /** Deltas appended since `text` was last made flat. */
  private appended = 0
  constructor(readonly cap: number) {}
  /**
   * Grown by `+=`, the text is a rope (internal/Flat.ts): ~56 bytes per
   * 4-character token, a 400-token answer ~23 KB instead of ~2. It is made
   * flat after a number of deltas that grows with it, so the copying stays
   * linear in the answer's length.
   */
  private append(delta: string): void {
    this.text += delta
    if (++this.appended >= Math.max(16, this.text.length >> 6)) {
      this.appended = 0
      flat(this.text)
    }
  }
  add(delta: string): string {
    if (this.capped || delta.length === 0) return ""
    // A token is at least one UTF-8 byte: while the text's bytes cannot reach the cap, nothing needs
    // counting (the answer is counted once, at the end).
    if (this.tokens === 0) {
      const bytes = this.bytes + Buffer.byteLength(delta)
      if (bytes <= this.cap) {
        this.append(delta)
        this.bytes = bytes
        return delta
      }
    }
    if (this.tokens === 0 && this.text.length > 0) this.tokens = Tokens.count(this.text)
    // Bounded by what may still be sent: a huge delta from a node costs no more than the cap.
    const n = Tokens.count(delta, this.cap - this.tokens)
    if (this.tokens + n <= this.cap) {
      this.append(delta)
      this.tokens += n
      return delta
    }
    const allowed = Tokens.truncate(delta, this.cap - this.tokens)
    this.capped = true
    this.append(allowed)
    this.tokens = this.cap
    return allowed
  }
}

type RunError = CapacityExhausted | UpstreamError | UpstreamTimeout

/** What the server wires around one answer (limits, logs, the drain), as plain callbacks. */
export interface RespondHooks {
  /** The dispatcher handed over a run: the node produced its first event. Undefined: done by plain calls. */
  readonly onRun?: ((run: Dispatcher.NodeRun) => Effect.Effect<void> | undefined) | undefined
  /** Registers `halt` for the drain deadline; returns its removal. A halted answer ends as `upstream_error`. */
  readonly onHalt?: ((halt: () => void) => () => void) | undefined
  /** The answer was stopped (running-time limit, drain, revocation) with this wire code. */
  readonly onStopped?: ((code: string) => void) | undefined
  /**
   * Registers `revoke` for the answer's key and account (spec §5: revoking a
   * key stops the applications using it): called with the refusal the key now
   * gets (401 / 403). Returns its removal.
   */
  readonly onRevocation?: ((revoke: (error: ApiError) => void) => () => void) | undefined
}

const HALTED = "The server is shutting down; the answer was cut at the drain deadline."

const broke = (failure: NodeFailure) =>
  new UpstreamError({ message: `The node stopped before the answer was complete (${failure.reason}).` })

const timedOut = () => new UpstreamTimeout({ message: "The request reached its running-time limit." })

const completionId = (requestId: string) => `chatcmpl-${requestId.replace(/^req_/, "")}`

const finishOf = (text: CappedText, node: "stop" | "length" | undefined): FinishReason =>
  text.capped || node === "length" ? "length" : "stop"

/** The finish reason the node sent, if any. */
interface NodeFinish {
  node: "stop" | "length" | undefined
}

/**
 * The text of one chunk of events that the cap still lets through, into
 * `literals` (when given) as the insides of its JSON string literals. Notes
 * the node's finish.
 */
const takeChunk = (
  chunk: Chunk.Chunk<NodeEvent>,
  text: CappedText,
  finish: NodeFinish,
  literals: Array<string> | undefined,
): void => {
  // Its array, indexed: a Chunk's iterator allocates a result per element.
  const events = Chunk.toReadonlyArray(chunk)
  for (let i = 0; i < events.length; i++) {
    const event = events[i]!
    if (event._tag === "Finish") {
      finish.node = event.reason
      continue
    }
    const allowed = text.add(event.text)
    if (allowed.length > 0 && literals !== undefined) literals.push(jsonInside(allowed))
    if (text.capped) break
  }
}

/**
 * Reads the node's events a chunk at a time (one pull per socket read, not
 * per event) until they end or the cap is reached; the text each chunk may
 * still send goes to `onText` at once, as the insides of its JSON string
 * literals. The node is stopped when the request's scope closes.
 */
// Declared once, not made per call (HttpServer.ts says why).
function* runEventsBody(
  pull: NodePull,
  text: CappedText,
  onText: ((literals: ReadonlyArray<string>) => Effect.Effect<void>) | undefined,
) {
  const finish: NodeFinish = { node: undefined }
  while (!text.capped) {
    const next = yield* Effect.either(pull)
    if (Either.isLeft(next)) {
      if (Option.isNone(next.left)) break
      return yield* Effect.fail(broke(next.left.value))
    }
    const literals = onText === undefined ? undefined : []
    takeChunk(next.right, text, finish, literals)
    if (onText !== undefined && literals !== undefined && literals.length > 0) yield* onText(literals)
  }
  return finishOf(text, finish.node)
}

const runEvents = (
  pull: NodePull,
  text: CappedText,
  onText: ((literals: ReadonlyArray<string>) => Effect.Effect<void>) | undefined,
) => Effect.gen(() => runEventsBody(pull, text, onText))

/**
 * `runEvents` by callback, for a node that offers `next` (HTTP nodes): each
 * chunk handled by plain calls, so a streamed token costs no Effect step;
 * `end` gets how reading ended, once. `onText` writes and says whether the
 * socket took it all; when not, the next read waits for `drain`, so a slow
 * client slows the node instead of filling memory. Returns the cleanup
 * (safe to call again), which stops reading.
 */
const pushEventsNow = (
  next: NodeNext,
  text: CappedText,
  res: ServerResponse,
  onText: ((literals: ReadonlyArray<string>) => boolean) | undefined,
  /** Called once the events ready at the start were handled (before any wait). */
  onStarted: (() => void) | undefined,
  end: (finished: Exit.Exit<FinishReason, UpstreamError>) => void,
): (() => void) => {
  const finish: NodeFinish = { node: undefined }
  let over = false
  let cancel: () => void = constVoid
  let offDrain: () => void = constVoid
  const ended = (result: Exit.Exit<FinishReason, UpstreamError>) => {
    over = true
    end(result)
  }
  const step = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>): void => {
    cancel = constVoid
    if (over) return
    if (Exit.isFailure(exit)) {
      const error = Cause.failureOption(exit.cause)
      ended(
        Option.isSome(error) && Option.isSome(error.value)
          ? Exit.fail(broke(error.value.value))
          : Exit.succeed(finishOf(text, finish.node)),
      )
      return
    }
    const literals = onText === undefined ? undefined : []
    takeChunk(exit.value, text, finish, literals)
    const took =
      onText !== undefined && literals !== undefined && literals.length > 0 ? onText(literals) : true
    if (text.capped) {
      ended(Exit.succeed(finishOf(text, finish.node)))
      return
    }
    if (took) {
      read()
      return
    }
    offDrain = SseWriter.drained(res, () => {
      offDrain = constVoid
      read()
    })
  }
  // A chunk ready at once is handled after `next` returns, so that its cancel is never lost. One
  // callback for every read of the answer, not one made per read (a paced stream reads per token).
  let early: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>> | undefined
  let sync = false
  const onRead = (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => {
    if (sync) early = exit
    else step(exit)
  }
  const read = () => {
    sync = true
    const stop = next(onRead)
    sync = false
    const now = early
    if (now === undefined) {
      cancel = stop
      return
    }
    early = undefined
    step(now)
  }
  read()
  if (!over) onStarted?.()
  return () => {
    over = true
    cancel()
    offDrain()
  }
}

/** `pushEventsNow` as one wait, its cleanup the scope's. */
const pushEvents = (
  scope: Scope.Scope,
  next: NodeNext,
  text: CappedText,
  res: ServerResponse,
  onText: ((literals: ReadonlyArray<string>) => boolean) | undefined,
  onStarted?: () => void,
) =>
  Finalizers.asyncIn<FinishReason, UpstreamError>(scope, (resume) =>
    pushEventsNow(next, text, res, onText, onStarted, resume),
  )

const usageJson = (prompt: number, completion: number) =>
  `{"prompt_tokens":${prompt},"completion_tokens":${completion},"total_tokens":${prompt + completion}}`

/** Why an answer was stopped from outside its fiber. */
type Stop = "upstream_timeout" | "halted" | { readonly revoked: ApiError }

/** What the answer sets up that the request's cleanup removes. */
interface AnswerOffs {
  halt: (() => void) | undefined
  keepAlive: (() => void) | undefined
  /** The SSE role chunk while it waits for the first write (a stopped answer writes it first). */
  opening: string
}

/** The held role chunk, once: "" after it was taken. */
const takeOpening = (offs: AnswerOffs): string => {
  const text = offs.opening
  offs.opening = ""
  return text
}

/** One answer's state, set up by `prepare` for either path (the Effect one or plain calls). */
interface Answer {
  readonly scope: Scope.Scope
  readonly res: ServerResponse
  readonly requestId: string
  readonly request: NormalizedRequest
  readonly outcome: Outcome
  readonly hooks: RespondHooks
  readonly config: GatewayConfigShape
  readonly text: CappedText
  readonly id: string
  readonly created: number
  readonly stop: (why: Stop) => void
  readonly offs: AnswerOffs
}

/** The request as the dispatcher gets it. */
const nodeRequestOf = (requestId: string, request: NormalizedRequest) => ({
  requestId,
  messages: request.messages,
  maxTokens: request.maxTokens,
  jsonMode: request.jsonMode,
  sampling: request.sampling,
})

/** The node produced its first event: noted, and the hooks told (an Effect only where one must run). */
const started = (answer: Answer, run: Dispatcher.NodeRun): Effect.Effect<void> | undefined => {
  const { outcome, hooks } = answer
  outcome.started = true
  outcome.nodeId = run.nodeId
  return hooks.onRun?.(run)
}

/** How the answer reads its run's events and ends, set up once the run started. */
interface Reading {
  /** Writes the text of each chunk pushed by callback (SSE); undefined for one JSON body. */
  readonly onText: ((literals: ReadonlyArray<string>) => boolean) | undefined
  /** Writes the role chunk when no text came at once (SSE). */
  readonly onStarted: (() => void) | undefined
  /** For a run read by `pull` (SSE): the first write, then each chunk's text. */
  readonly pulled:
    | {
        readonly first: Effect.Effect<void>
        readonly onText: (literals: ReadonlyArray<string>) => Effect.Effect<void>
      }
    | undefined
  /** Writes the answer's end from how reading ended; fails (nothing written) only before the first byte. */
  readonly finish: (finished: Exit.Exit<FinishReason, UpstreamError>) => Exit.Exit<void, UpstreamError>
}

/** The answer's opening once the run started: a JSON body waits for the end, a stream starts now. */
const open = (answer: Answer): Reading => {
  const { res, requestId, request, outcome, hooks, config, text, id, created, stop, offs } = answer
  // The drain may end a running answer; a request not yet started is the drain's own to refuse.
  if (hooks.onHalt !== undefined) offs.halt = hooks.onHalt(() => stop("halted"))
  if (!request.stream) {
    return {
      onText: undefined,
      onStarted: undefined,
      pulled: undefined,
      finish: (finished) => {
        if (Exit.isFailure(finished)) return finished
        const finish = finished.value
        outcome.finishReason = finish
        const completionTokens = Tokens.count(text.text)
        outcome.completionTokens = completionTokens
        const body = `{"id":"${id}","object":"chat.completion","created":${created},"model":${JSON.stringify(request.model)},"choices":[{"index":0,"message":{"role":"assistant","content":${JSON.stringify(text.text)}},"finish_reason":"${finish}"}],"usage":${usageJson(request.promptTokens, completionTokens)}}`
        res.writeHead(200, {
          "content-type": "application/json",
          "content-length": String(Buffer.byteLength(body)),
          [REQUEST_ID_HEADER]: requestId,
        })
        res.end(body)
        outcome.status = "completed"
        return Exit.void
      },
    }
  }

  const usageTail = request.includeUsage ? ',"usage":null}' : "}"
  // Kept while the stream runs, so made flat (internal/Flat.ts), as are the framing strings below.
  const head = flat(
    `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(request.model)},"choices":[`,
  )
  // Every part is JSON.stringify's (or fixed) text, so no raw line break can occur: one `data:`
  // line, framed here without encodeData's scan of each chunk.
  const chunk = (delta: string, finish: string) =>
    `data: ${head}{"index":0,"delta":${delta},"finish_reason":${finish}}]${usageTail}\n\n`

  res.writeHead(200, SseEncoder.sseHeadersWith(REQUEST_ID_HEADER, requestId))
  flatHeader(res)
  outcome.headersSent = true
  // The role chunk goes out with what is written first (the node's first token is here already:
  // `run` waited for it), so that it and the first text are one `res.write` — each costs four
  // writes to the socket with chunked framing. Nothing is held past the answer's first step.
  offs.opening = chunk('{"role":"assistant","content":""}', "null")
  const opened = () => takeOpening(offs)
  const alive: Timers.KeepAliveStream = {
    lastWrite: Date.now(),
    intervalMillis: config.keepAliveIntervalMillis,
    ping: () => {
      if (!res.writableEnded) SseWriter.writeChunk(res, opened() + SseEncoder.keepAlive)
    },
  }
  offs.keepAlive = Timers.keepAlive(alive)
  const send = (data: string) => {
    alive.lastWrite = Date.now()
    return SseWriter.write(res, opened() + data)
  }

  // A content chunk is the same text around each delta: built once per answer, not per token.
  const contentOpen = flat(`data: ${head}{"index":0,"delta":{"content":"`)
  const contentClose = flat(`"},"finish_reason":null}]${usageTail}\n\n`)
  const deltasData = (literals: ReadonlyArray<string>) => {
    let data = ""
    for (const literal of literals) data += contentOpen + literal + contentClose
    return data
  }
  return {
    onText: (literals) => {
      alive.lastWrite = Date.now()
      return SseWriter.writeChunk(res, opened() + deltasData(literals))
    },
    onStarted: () => {
      // No text at once: the role chunk leaves now, as it would have without waiting.
      if (offs.opening !== "") SseWriter.writeChunk(res, opened())
    },
    pulled: { first: send(""), onText: (literals) => send(deltasData(literals)) },
    finish: (finished) => {
      if (Exit.isFailure(finished)) {
        const failure = Cause.failureOption(finished.cause)
        // A defect of the reading is not written here: it fails the request.
        if (Option.isNone(failure)) return finished
        outcome.status = "upstream_error"
        outcome.completionTokens = Tokens.count(text.text)
        // Spec §6: a failure after the stream started is the last event, code upstream_error, no [DONE].
        res.end(
          opened() +
            SseEncoder.encodeData(
              streamErrorEvent(
                { message: failure.value.message, type: "server_error", code: "upstream_error" },
                requestId,
              ),
            ),
        )
        return Exit.void
      }
      outcome.finishReason = finished.value
      const completionTokens = Tokens.count(text.text)
      outcome.completionTokens = completionTokens
      let tail = chunk("{}", `"${finished.value}"`)
      if (request.includeUsage) {
        tail += SseEncoder.encodeData(
          `${head}],"usage":${usageJson(request.promptTokens, completionTokens)}}`,
        )
      }
      res.end(opened() + tail + SseEncoder.DONE)
      outcome.status = "completed"
      return Exit.void
    },
  }
}

/**
 * The answer once its run started, the Effect way: a generator declared
 * once, its request passed in (HttpServer.ts says why).
 */
function* answerRunBody(answer: Answer, run: Dispatcher.NodeRun, ran: Effect.Effect<void> | undefined) {
  if (ran !== undefined) yield* ran
  const reading = open(answer)
  let finished: Exit.Exit<FinishReason, UpstreamError>
  if (run.next !== undefined) {
    finished = yield* Effect.exit(
      pushEvents(answer.scope, run.next, answer.text, answer.res, reading.onText, reading.onStarted),
    )
  } else {
    if (reading.pulled !== undefined) yield* reading.pulled.first
    finished = yield* Effect.exit(runEvents(run.pull, answer.text, reading.pulled?.onText))
  }
  yield* reading.finish(finished)
}

/** The whole answer the Effect way, from the dispatcher's run (or what goes on to it). */
function* answerBody(answer: Answer, running: Effect.Effect<Dispatcher.NodeRun, RunError>) {
  const run = yield* running
  yield* Effect.gen(() => answerRunBody(answer, run, started(answer, run)))
}

/**
 * The answer's setup, whichever path runs it: the running-time limit and the
 * revocation watch, and the cleanup that writes a stopped answer. `interrupt`
 * ends the request (its fiber, or its plain run).
 */
const prepare = (
  scope: Scope.Scope,
  res: ServerResponse,
  requestId: string,
  request: NormalizedRequest,
  outcome: Outcome,
  hooks: RespondHooks,
  config: GatewayConfigShape,
  interrupt: () => void,
): Answer => {
  const startedAt = Date.now()
  const created = Math.floor(startedAt / 1000)
  const id = completionId(requestId)
  const text = new CappedText(request.maxTokens)
  let stopped: Stop | undefined
  const offs: AnswerOffs = { halt: undefined, keepAlive: undefined, opening: "" }
  let offRevocation: (() => void) | undefined
  const stop = (why: Stop) => {
    if (stopped !== undefined || outcome.status !== "pending") return
    stopped = why
    outcome.status = why === "upstream_timeout" ? "upstream_timeout" : "upstream_error"
    interrupt()
  }
  const cancelDeadline = Timers.deadline(request.preset.timeoutMillis, () => stop("upstream_timeout"))
  if (hooks.onRevocation !== undefined)
    offRevocation = hooks.onRevocation((error) => stop({ revoked: error }))

  /** The answer of a stopped request, written once the request was interrupted (its scope closing). */
  const writeStopped = (why: Stop) => {
    hooks.onStopped?.(
      why === "upstream_timeout"
        ? "upstream_timeout"
        : typeof why === "object" && !outcome.headersSent
          ? why.revoked._tag === "ValidationFailed"
            ? "validation_failed"
            : why.revoked.code
          : "upstream_error",
    )
    if (res.writableEnded || res.destroyed) return
    if (outcome.headersSent) {
      outcome.completionTokens = Tokens.count(text.text)
      const message =
        why === "upstream_timeout"
          ? "The request reached its running-time limit after the stream started."
          : why === "halted"
            ? HALTED
            : `The request was ended: ${why.revoked.message}`
      const opening = takeOpening(offs)
      // Spec §6: a failure after the stream started is the last event, code upstream_error, no [DONE].
      res.end(
        opening +
          SseEncoder.encodeData(
            streamErrorEvent({ message, type: "server_error", code: "upstream_error" }, requestId),
          ),
      )
      return
    }
    if (outcome.started) outcome.completionTokens = Tokens.count(text.text)
    const rendered = renderError(
      why === "upstream_timeout"
        ? timedOut()
        : why === "halted"
          ? new UpstreamError({ message: HALTED })
          : why.revoked,
      requestId,
    )
    res.writeHead(rendered.status, rendered.headers)
    res.end(rendered.body)
  }

  // A plain cleanup of the scope: no fiber-ref diff and patch, no Effect step per request.
  Finalizers.addNow(scope, () => {
    cancelDeadline()
    offs.halt?.()
    offs.keepAlive?.()
    offRevocation?.()
    if (stopped !== undefined) writeStopped(stopped)
    // Cut short (disconnect, interruption): what was sent is counted now, before billing settles it.
    else if (outcome.started && outcome.status === "pending")
      outcome.completionTokens = Tokens.count(text.text)
  })
  return { scope, res, requestId, request, outcome, hooks, config, text, id, created, stop, offs }
}

/**
 * Answers the request on `res`, in the caller's scope (the node stream and
 * slots live there). Fails (with nothing written) only before the first
 * token; later failures are written as the stream's last event.
 *
 * The running-time limit and the drain stop an answer by interrupting its
 * fiber from one shared timer list — no race or timeout per request — and
 * the finalizer below writes what the client gets: 504 (or 502 when halted)
 * before anything was sent, the final error event after.
 */
export const respond = (
  res: ServerResponse,
  requestId: string,
  request: NormalizedRequest,
  outcome: Outcome,
  hooks: RespondHooks = {},
): Effect.Effect<void, RunError, Dispatcher.Dispatcher | GatewayConfig | Scope.Scope> =>
  Effect.flatMap(Effect.scope, (scope) => respondIn(scope, res, requestId, request, outcome, hooks))

/**
 * `respond` in the scope given rather than the fiber's (the gateway keeps
 * each request's scope out of its fiber's context: a copy of the context
 * per request, ~2.5 KB, spared).
 */
export const respondIn = (
  scope: Scope.Scope,
  res: ServerResponse,
  requestId: string,
  request: NormalizedRequest,
  outcome: Outcome,
  hooks: RespondHooks = {},
): Effect.Effect<void, RunError, Dispatcher.Dispatcher | GatewayConfig> =>
  Effect.withFiberRuntime<void, RunError, Dispatcher.Dispatcher | GatewayConfig>((fiber) => {
    const context = fiber.currentContext
    const dispatcher = Context.unsafeGet(context, Dispatcher.Dispatcher)
    const config = Context.unsafeGet(context, GatewayConfig)
    const answer = prepare(scope, res, requestId, request, outcome, hooks, config, () =>
      fiber.unsafeInterruptAsFork(FiberId.none),
    )
    const running = dispatcher.runIn(scope, request.preset, nodeRequestOf(requestId, request))
    return Effect.gen(() => answerBody(answer, running))
  })

/**
 * `respondIn` by plain calls, on no fiber: `done` gets `Exit.void` (or the
 * failure) when the answer ran without a wait in Effect — a run begun by
 * plain calls (`Dispatcher.beginIn`) and read by callback, its first token
 * counted by plain calls — else the Effect that goes on from where the plain
 * calls stopped. Called once, perhaps before this returns; never once
 * `scope` closed. `interrupt` ends the request (a stop: the running-time
 * limit, the drain, a revocation); `runtime` gives the dispatcher its
 * services.
 */
export const respondNow = (
  scope: Scope.Scope,
  res: ServerResponse,
  requestId: string,
  request: NormalizedRequest,
  outcome: Outcome,
  hooks: RespondHooks,
  dispatcher: Dispatcher.DispatcherShape,
  config: GatewayConfigShape,
  runtime: Runtime.Runtime<never>,
  interrupt: () => void,
  done: (result: Effect.Effect<void, RunError>) => void,
): void => {
  const answer = prepare(scope, res, requestId, request, outcome, hooks, config, interrupt)
  /** A callback's work, its throw a defect of the request (not of the event loop). */
  const guarded = (work: () => void) => {
    // Once the request ended (its scope closing or closed), a callback has nothing left to do.
    if (!Finalizers.isOpen(scope)) return
    try {
      work()
    } catch (thrown) {
      done(Exit.die(thrown))
    }
  }
  const begun = (result: Effect.Effect<Dispatcher.NodeRun, RunError>) =>
    guarded(() => {
      if (!Exit.isExit(result)) {
        done(Effect.gen(() => answerBody(answer, result)))
        return
      }
      const exit = result as Exit.Exit<Dispatcher.NodeRun, RunError>
      if (Exit.isFailure(exit)) {
        done(exit)
        return
      }
      const run = exit.value
      const ran = started(answer, run)
      const next = run.next
      if (ran !== undefined || next === undefined) {
        done(Effect.gen(() => answerRunBody(answer, run, ran)))
        return
      }
      const reading = open(answer)
      const ended = (finished: Exit.Exit<FinishReason, UpstreamError>) =>
        guarded(() => done(reading.finish(finished)))
      Finalizers.addNow(
        scope,
        pushEventsNow(next, answer.text, res, reading.onText, reading.onStarted, ended),
      )
    })
  dispatcher.beginIn(scope, runtime, request.preset, nodeRequestOf(requestId, request), begun)
}
