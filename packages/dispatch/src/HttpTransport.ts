/**
 * Nodes that speak the OpenAI chat-completions protocol over HTTP (llama.cpp
 * server, vLLM, Ollama, SGLang, `apps/node-sim`). The gateway always asks for
 * a stream and counts tokens itself; the node's `usage` is ignored.
 *
 * Connections are pooled and kept alive by Node's fetch. A stream the consumer
 * abandons (client gone, hedge lost, cap reached) aborts its HTTP request, so
 * the node stops generating; a stream read to its end leaves the connection
 * for the next request.
 */
import { SseDecoder } from "@swarmgate/sse"
import { Chunk, Duration, Effect, Either, Stream } from "effect"
import type { NodeSpec } from "./NodesFile"
import {
  type NodeEvent,
  NodeFailure,
  type NodeMessage,
  type NodeRequest,
  type SwarmNode,
} from "./NodeTransport"

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

/** fetch wraps socket errors (`ECONNREFUSED`, `UND_ERR_SOCKET`, …) in a TypeError's cause. */
const describe = (error: unknown): string => {
  const cause = (error as { cause?: { code?: string; message?: string } })?.cause
  if (cause?.code !== undefined) return cause.code
  if (cause?.message !== undefined) return cause.message
  return error instanceof Error ? error.message : String(error)
}

const MAX_ERROR_BODY = 2_000

interface ChoiceChunk {
  readonly choices?: ReadonlyArray<{
    readonly delta?: { readonly content?: string | null }
    readonly message?: { readonly content?: string | null }
    readonly finish_reason?: string | null
  }>
  readonly error?: { readonly message?: string } | string
}

const finishOf = (reason: string): "stop" | "length" => (reason === "length" ? "length" : "stop")

export const make = (options: HttpNodeOptions): SwarmNode => {
  const { id } = options
  const endpoint = `${options.url.replace(/\/+$/, "")}/v1/chat/completions`
  const connectTimeout = Duration.millis(options.connectTimeoutMillis ?? 10_000)
  const headers: Record<string, string> = {
    "content-type": "application/json",
    accept: "text/event-stream",
  }
  if (options.apiKey !== undefined) headers.authorization = `Bearer ${options.apiKey}`
  const failure = (reason: string) => new NodeFailure({ nodeId: id, reason })

  const generate = (request: NodeRequest): Stream.Stream<NodeEvent, NodeFailure> =>
    Stream.unwrapScoped(
      Effect.gen(function* () {
        const controller = new AbortController()
        // Set once the body was read to its end: only then may the connection be reused.
        let complete = false
        yield* Effect.addFinalizer(() =>
          Effect.sync(() => {
            if (!complete) controller.abort()
          }),
        )
        const response = yield* Effect.tryPromise({
          try: () =>
            fetch(endpoint, {
              method: "POST",
              headers: { ...headers, "x-request-id": request.requestId },
              body: JSON.stringify(requestBody(request)),
              signal: controller.signal,
            }),
          catch: (error) => failure(`unreachable: ${describe(error)}`),
        }).pipe(
          Effect.timeoutFail({
            duration: connectTimeout,
            onTimeout: () => failure(`timeout: no response within ${Duration.toMillis(connectTimeout)} ms`),
          }),
        )
        if (!response.ok) {
          const text = yield* Effect.promise(() => response.text().catch(() => ""))
          return Stream.fail(failure(`http_${response.status}: ${text.slice(0, MAX_ERROR_BODY)}`))
        }
        const type = response.headers.get("content-type") ?? ""
        if (!type.includes("text/event-stream")) {
          // A server that ignored `stream: true` and answered with one JSON body.
          const body = yield* Effect.tryPromise({
            try: () => response.json() as Promise<ChoiceChunk>,
            catch: (error) => failure(`bad_body: ${describe(error)}`),
          })
          complete = true
          const choice = body.choices?.[0]
          const content = choice?.message?.content ?? ""
          const finish: NodeEvent = { _tag: "Finish", reason: finishOf(choice?.finish_reason ?? "stop") }
          return Stream.make<Array<NodeEvent>>(
            ...(content.length > 0 ? [{ _tag: "Delta", text: content } as NodeEvent] : []),
            finish,
          )
        }
        const body = response.body
        if (body === null) return Stream.fail(failure("bad_body: no body"))

        let done = false
        let failed = false
        let finish: "stop" | "length" | undefined
        // A failure ends the events at its place in the chunk: the deltas before it still count.
        const decode = (
          events: Chunk.Chunk<SseDecoder.SseEvent>,
        ): Chunk.Chunk<Either.Either<NodeEvent, NodeFailure>> => {
          const out: Array<Either.Either<NodeEvent, NodeFailure>> = []
          for (const event of events) {
            // Whatever follows [DONE] is read (to free the connection) and ignored.
            if (done || failed) continue
            if (event.data === "[DONE]") {
              done = true
              continue
            }
            let chunk: ChoiceChunk
            try {
              chunk = JSON.parse(event.data) as ChoiceChunk
            } catch {
              failed = true
              out.push(Either.left(failure(`bad_event: ${event.data.slice(0, 200)}`)))
              continue
            }
            if (chunk.error !== undefined) {
              const message = typeof chunk.error === "string" ? chunk.error : (chunk.error.message ?? "")
              failed = true
              out.push(Either.left(failure(`node_error: ${message.slice(0, MAX_ERROR_BODY)}`)))
              continue
            }
            const choice = chunk.choices?.[0]
            const content = choice?.delta?.content
            if (typeof content === "string" && content.length > 0)
              out.push(Either.right({ _tag: "Delta", text: content }))
            if (typeof choice?.finish_reason === "string") finish = finishOf(choice.finish_reason)
          }
          return Chunk.unsafeFromArray(out)
        }
        const bytes = Stream.fromReadableStream({
          evaluate: () => body,
          onError: (error) => failure(`broken: ${describe(error)}`),
        })
        const events: Stream.Stream<NodeEvent, NodeFailure> = SseDecoder.decodeSse(bytes).pipe(
          Stream.mapChunks(decode),
          Stream.takeUntil(Either.isLeft),
          Stream.mapEffect((item) =>
            Either.isRight(item) ? Effect.succeed(item.right) : Effect.fail(item.left),
          ),
        )
        return events.pipe(
          Stream.concat(
            Stream.suspend((): Stream.Stream<NodeEvent, NodeFailure> => {
              complete = true
              if (done || finish !== undefined)
                return Stream.succeed<NodeEvent>({ _tag: "Finish", reason: finish ?? "stop" })
              return Stream.fail(failure("truncated: the stream ended without finish_reason or [DONE]"))
            }),
          ),
        )
      }),
    )

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
    capacity: options.capacity,
    models: options.models,
    vision: options.vision ?? false,
    generate,
    probe,
  }
}
