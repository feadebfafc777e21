/**
 * `/admin/v1/nodes`: the swarm as operators see it, and membership.
 *
 * - `GET /admin/v1/nodes`, `GET /admin/v1/nodes/{id}`: state, load, health.
 * - `POST /admin/v1/nodes` `{id, url, models, capacity, vision?, api_key?, ttl_ms?}`:
 *   registers an OpenAI-compatible HTTP node (201), or renews its
 *   registration (200): a node that stops renewing is drained after `ttl_ms`.
 * - `DELETE /admin/v1/nodes/{id}`: drains the node (202): no new requests,
 *   removed once its running requests end.
 */
import { Dispatcher, NodesFile } from "@swarmgate/dispatch"
import { InvalidRequest } from "@swarmgate/protocol"
import { Effect, Either } from "effect"
import { AdminNotFound, type AdminResponse, errorResponse } from "./Admin"

const MAX_TTL_MILLIS = 24 * 3600 * 1000

const seconds = (millis: number | undefined) => (millis === undefined ? null : Math.round(millis) / 1000)
const rounded = (value: number | undefined, digits = 1) =>
  value === undefined ? null : Math.round(value * 10 ** digits) / 10 ** digits

export const nodeView = (node: Dispatcher.NodeStatus) => ({
  id: node.id,
  object: "node",
  url: node.url ?? null,
  source: node.source,
  state: node.state,
  circuit: node.circuit,
  models: node.models,
  capacity: node.capacity,
  in_flight: node.inFlight,
  vision: node.vision,
  requests: node.requests,
  failures: node.failures,
  error_rate: Math.round(node.errorRate * 1000) / 1000,
  ttft_ms: rounded(node.ttftMillis),
  ttft_p95_ms: rounded(node.ttftP95Millis),
  tokens_per_second: rounded(node.tokensPerSecond),
  reputation: Math.round(node.reputation * 1000) / 1000,
  hedges: node.hedges,
  last_failure: node.lastFailure ?? null,
  expires_at: seconds(node.expiresAt),
})

export type NodeView = ReturnType<typeof nodeView>

const notFound = (id: string) => errorResponse(new AdminNotFound({ message: `No node ${id}.` }))
const invalid = (message: string) => errorResponse(new InvalidRequest({ message, param: null }))

const register = (dispatcher: Dispatcher.DispatcherShape, body: unknown) =>
  Effect.gen(function* () {
    if (typeof body !== "object" || body === null || Array.isArray(body))
      return invalid("The body must be a node: {id, url, models, capacity, vision?, api_key?, ttl_ms?}.")
    const { ttl_ms: ttl, ...rest } = body as Record<string, unknown>
    if (
      ttl !== undefined &&
      !(Number.isInteger(ttl) && (ttl as number) > 0 && (ttl as number) <= MAX_TTL_MILLIS)
    )
      return invalid(`ttl_ms must be an integer between 1 and ${MAX_TTL_MILLIS}.`)
    const spec = NodesFile.decodeNodeSpec(rest)
    if (Either.isLeft(spec)) return invalid(`Invalid node: ${spec.left}`)
    const result = yield* dispatcher.register(spec.right, ttl as number | undefined)
    if (Either.isLeft(result)) return invalid(result.left)
    return { status: result.right.created ? 201 : 200, body: nodeView(result.right.node) }
  })

/** Answers `/admin/v1/nodes/…`; `segments` are the path segments after `nodes`. */
export const handle = (
  method: string,
  segments: ReadonlyArray<string>,
  body: unknown,
): Effect.Effect<AdminResponse, never, Dispatcher.Dispatcher> =>
  Effect.gen(function* () {
    const dispatcher = yield* Dispatcher.Dispatcher
    const [id, ...rest] = segments
    if (rest.length > 0) return { status: 404, body: undefined }
    if (id === undefined) {
      if (method === "GET") return { status: 200, body: { data: (yield* dispatcher.status).map(nodeView) } }
      if (method === "POST") return yield* register(dispatcher, body)
      return { status: 405, body: undefined }
    }
    if (method === "GET") {
      const node = (yield* dispatcher.status).find((n) => n.id === id)
      return node === undefined ? notFound(id) : { status: 200, body: nodeView(node) }
    }
    if (method === "DELETE") {
      const drained = yield* dispatcher.drain(id)
      return drained === undefined ? notFound(id) : { status: 202, body: nodeView(drained) }
    }
    return { status: 405, body: undefined }
  })
