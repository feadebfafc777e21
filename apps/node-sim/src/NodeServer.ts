/**
 * Simulated nodes behind an OpenAI-compatible HTTP surface, one process for
 * any number of nodes: `POST /nodes/{id}/v1/chat/completions` reaches one
 * node, `POST /v1/chat/completions` the node named by `model` (or the least
 * busy one). Failures look like real servers' failures: a refusal is a 503,
 * a failure before the first token an error event on an open stream, a
 * broken stream a dropped connection, a stall silence.
 */
import { randomUUID } from "node:crypto"
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { SseEncoder, SseWriter } from "@swarmgate/sse"
import {
  type GenerationInput,
  makeSimNode,
  type NodeProfile,
  type SimEvent,
  type SimNode,
  type SimNodeFailure,
} from "@swarmgate/swarm-sim"
import { Effect, Exit, Stream } from "effect"

export interface ServedNode {
  readonly id: string
  readonly url: string
  readonly capacity: number
  readonly vision: boolean
  /** Preset → model name, ready for a nodes file or a registration. */
  readonly models: Readonly<Record<string, string>>
}

export interface NodeStats {
  readonly id: string
  readonly inFlight: number
  readonly requests: number
  readonly refusedAtCapacity: number
  readonly aborted: number
}

export interface NodeServer {
  readonly host: string
  readonly port: number
  readonly nodes: ReadonlyArray<ServedNode>
  readonly stats: () => ReadonlyArray<NodeStats>
  readonly close: () => Promise<void>
}

export interface NodeServerOptions {
  readonly port: number
  readonly host: string
  readonly seed: number
  readonly speed: number
  readonly idPrefix?: string | undefined
  readonly presets: ReadonlyArray<string>
  readonly profiles: (idPrefix: string) => ReadonlyArray<NodeProfile>
}

interface Served {
  readonly node: SimNode
  inFlight: number
  requests: number
  refusedAtCapacity: number
  aborted: number
}

const MAX_BODY_BYTES = 16 * 1024 * 1024

const sendJson = (res: ServerResponse, status: number, body: unknown) => {
  const text = JSON.stringify(body)
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
  })
  res.end(text)
}

const sendError = (res: ServerResponse, status: number, message: string, code: string) =>
  sendJson(res, status, {
    error: { message, type: status < 500 ? "invalid_request_error" : "server_error", code },
  })

const readBody = (req: IncomingMessage) =>
  new Promise<Buffer>((resolve, reject) => {
    const chunks: Array<Buffer> = []
    let size = 0
    req.on("data", (chunk: Buffer) => {
      size += chunk.length
      if (size > MAX_BODY_BYTES) {
        reject(new Error("too large"))
        req.destroy()
      } else chunks.push(chunk)
    })
    req.on("end", () => resolve(Buffer.concat(chunks)))
    req.on("error", reject)
  })

type Part = {
  readonly type?: unknown
  readonly text?: unknown
  readonly image_url?: { readonly url?: unknown }
}

/** The OpenAI request body as the simulator's input; a string names what is wrong. */
export const toInput = (body: unknown): GenerationInput | string => {
  if (typeof body !== "object" || body === null) return "the body must be a JSON object"
  const b = body as Record<string, unknown>
  if (!Array.isArray(b.messages) || b.messages.length === 0) return "messages must be a non-empty array"
  const images: Array<{ mediaType: string; bytes: number }> = []
  const messages: Array<{ role: string; content: string }> = []
  for (const message of b.messages as Array<{ role?: unknown; content?: unknown }>) {
    if (typeof message?.role !== "string") return "every message needs a role"
    if (typeof message.content === "string") messages.push({ role: message.role, content: message.content })
    else if (Array.isArray(message.content)) {
      const texts: Array<string> = []
      for (const part of message.content as Array<Part>) {
        if (part?.type === "text" && typeof part.text === "string") texts.push(part.text)
        else if (part?.type === "image_url" && typeof part.image_url?.url === "string") {
          const url = part.image_url.url
          const comma = url.indexOf(",")
          const data = url.startsWith("data:") && comma > 0
          images.push({
            mediaType: data ? (url.slice(5, comma).split(";")[0] ?? "image/*") : "image/*",
            bytes: data ? Math.floor(((url.length - comma - 1) * 3) / 4) : 0,
          })
        } else return "unsupported content part"
      }
      messages.push({ role: message.role, content: texts.join("\n") })
    } else if (message.content === null || message.content === undefined)
      messages.push({ role: message.role, content: "" })
    else return "content must be a string or a list of parts"
  }
  const cap = b.max_completion_tokens ?? b.max_tokens
  if (cap !== undefined && cap !== null && (typeof cap !== "number" || !Number.isInteger(cap) || cap < 0))
    return "max_tokens must be a non-negative integer"
  const stop =
    b.stop === undefined || b.stop === null ? undefined : typeof b.stop === "string" ? [b.stop] : b.stop
  if (stop !== undefined && !(Array.isArray(stop) && stop.every((s) => typeof s === "string")))
    return "stop must be a string or a list of strings"
  return {
    messages,
    maxTokens: typeof cap === "number" ? cap : Number.POSITIVE_INFINITY,
    jsonMode: (b.response_format as { type?: unknown } | undefined)?.type === "json_object",
    seed: typeof b.seed === "number" ? b.seed : undefined,
    temperature: typeof b.temperature === "number" ? b.temperature : undefined,
    stop: stop as Array<string> | undefined,
    images: images.length > 0 ? images : undefined,
  }
}

const generation = (
  served: Served,
  res: ServerResponse,
  input: GenerationInput,
  model: string,
  stream: boolean,
): Effect.Effect<void> => {
  const id = `chatcmpl-${randomUUID().replaceAll("-", "")}`
  const created = Math.floor(Date.now() / 1000)
  const chunk = (delta: object, finish: string | null) =>
    SseEncoder.encodeEvent({
      id,
      object: "chat.completion.chunk",
      created,
      model,
      choices: [{ index: 0, delta, finish_reason: finish }],
    })
  // What was written reaches the client before the connection drops, as when a real node dies.
  const drop = Effect.async<void>((resume) => {
    res.write("", () => {
      res.destroy()
      resume(Effect.void)
    })
  })
  const nodeFailed = (failure: SimNodeFailure) =>
    failure.reason === "broke_mid_stream"
      ? drop
      : Effect.sync(() => {
          if (failure.reason === "refused" && !res.headersSent)
            return sendError(res, 503, "The node refused the request.", "refused")
          if (!res.headersSent) res.writeHead(200, SseEncoder.SSE_HEADERS)
          res.end(
            SseEncoder.encodeEvent({
              error: { message: `node failure: ${failure.reason}`, type: "server_error" },
            }),
          )
        })

  if (!stream) {
    return Effect.matchEffect(Stream.runCollect(served.node.generate(input)), {
      onFailure: (failure) =>
        failure.reason === "broke_mid_stream"
          ? Effect.sync(() => res.destroy())
          : Effect.sync(() =>
              sendError(
                res,
                failure.reason === "refused" ? 503 : 500,
                `node failure: ${failure.reason}`,
                failure.reason,
              ),
            ),
      onSuccess: (events) =>
        Effect.sync(() => {
          let text = ""
          let finish = "stop"
          for (const event of events) {
            if (event._tag === "Piece") text += event.text
            else finish = event.reason
          }
          sendJson(res, 200, {
            id,
            object: "chat.completion",
            created,
            model,
            choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: finish }],
          })
        }),
    })
  }

  let started = false
  const onEvent = (event: SimEvent): Effect.Effect<void> => {
    let out = ""
    if (!started) {
      started = true
      // Headers go with the first event, so a refusal can still be a plain 503.
      res.writeHead(200, SseEncoder.SSE_HEADERS)
      out += chunk({ role: "assistant", content: "" }, null)
    }
    out += event._tag === "Piece" ? chunk({ content: event.text }, null) : chunk({}, event.reason)
    if (event._tag === "Finish") {
      res.end(out + SseEncoder.DONE)
      return Effect.void
    }
    return SseWriter.write(res, out)
  }
  return Effect.catchAll(Stream.runForEach(served.node.generate(input), onEvent), nodeFailed)
}

export const startNodeServer = async (options: NodeServerOptions): Promise<NodeServer> => {
  const byId = new Map<string, Served>()
  let order: Array<Served> = []

  const pickNode = (model: unknown): Served | undefined => {
    if (typeof model === "string" && byId.has(model)) return byId.get(model)
    let best: Served | undefined
    for (const served of order)
      if (
        best === undefined ||
        served.inFlight / served.node.profile.capacity < best.inFlight / best.node.profile.capacity
      )
        best = served
    return best
  }

  const chat = async (req: IncomingMessage, res: ServerResponse, nodeId: string | undefined) => {
    let body: unknown
    try {
      body = JSON.parse((await readBody(req)).toString("utf8"))
    } catch {
      return sendError(res, 400, "The body must be JSON.", "invalid_json")
    }
    const input = toInput(body)
    if (typeof input === "string") return sendError(res, 400, input, "invalid_request")
    const served = nodeId === undefined ? pickNode((body as { model?: unknown }).model) : byId.get(nodeId)
    if (served === undefined) return sendError(res, 404, `No node ${nodeId}.`, "node_not_found")
    if (served.inFlight >= served.node.profile.capacity) {
      served.refusedAtCapacity++
      return sendError(res, 429, "The node is at capacity.", "capacity")
    }
    served.inFlight++
    served.requests++
    const model =
      typeof (body as { model?: unknown }).model === "string"
        ? (body as { model: string }).model
        : served.node.profile.id
    const fiber = Effect.runFork(
      generation(served, res, input, model, (body as { stream?: unknown }).stream === true),
    )
    res.on("close", () => {
      if (!res.writableFinished) {
        served.aborted++
        fiber.unsafeInterruptAsFork(fiber.id())
      }
    })
    fiber.addObserver((exit) => {
      served.inFlight--
      if (Exit.isFailure(exit) && !res.headersSent) sendError(res, 500, "internal error", "internal")
    })
  }

  const models = (res: ServerResponse, served: ReadonlyArray<Served>) =>
    sendJson(res, 200, {
      object: "list",
      data: served.map((s) => ({ id: s.node.profile.id, object: "model", created: 0, owned_by: "node-sim" })),
    })

  const server: Server = createServer({ keepAliveTimeout: 30_000 }, (req, res) => {
    const path = (req.url ?? "/").split("?")[0]!
    const method = req.method ?? "GET"
    const routed = /^\/nodes\/([^/]+)(\/.*)$/.exec(path)
    const nodeId = routed === null ? undefined : decodeURIComponent(routed[1]!)
    const rest = routed === null ? path : routed[2]!
    if (nodeId !== undefined && !byId.has(nodeId))
      return sendError(res, 404, `No node ${nodeId}.`, "node_not_found")
    if (rest === "/v1/chat/completions" && method === "POST") {
      chat(req, res, nodeId).catch(() => {
        if (!res.headersSent) sendError(res, 500, "internal error", "internal")
      })
      return
    }
    if (rest === "/v1/models" && method === "GET")
      return models(res, nodeId === undefined ? order : [byId.get(nodeId)!])
    if (rest === "/healthz" && method === "GET") return sendJson(res, 200, { status: "ok" })
    if (rest === "/stats" && method === "GET") return sendJson(res, 200, { data: stats() })
    sendError(res, 404, "Not found.", "not_found")
  })

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject)
    server.listen(options.port, options.host, resolve)
  })
  const address = server.address() as AddressInfo
  const prefix = options.idPrefix ?? `node-${address.port}-`
  order = options.profiles(prefix).map((profile) => ({
    node: makeSimNode(profile, { speed: options.speed, seed: options.seed }),
    inFlight: 0,
    requests: 0,
    refusedAtCapacity: 0,
    aborted: 0,
  }))
  for (const served of order) byId.set(served.node.profile.id, served)

  const stats = (): ReadonlyArray<NodeStats> =>
    order.map((s) => ({
      id: s.node.profile.id,
      inFlight: s.inFlight,
      requests: s.requests,
      refusedAtCapacity: s.refusedAtCapacity,
      aborted: s.aborted,
    }))

  const base = `http://${address.address}:${address.port}`
  return {
    host: address.address,
    port: address.port,
    nodes: order.map(({ node: { profile } }) => ({
      id: profile.id,
      url: `${base}/nodes/${profile.id}`,
      capacity: profile.capacity,
      vision: profile.vision,
      models: Object.fromEntries(options.presets.map((preset) => [preset, profile.id])),
    })),
    stats,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      }),
  }
}
