/**
 * `GET /v1/models`: the presets, with the capabilities their nodes give them.
 */
import type { ServerResponse } from "node:http"
import { Dispatcher } from "@swarmgate/dispatch"
import { type Model, REQUEST_ID_HEADER } from "@swarmgate/protocol"
import { Effect } from "effect"

export const models = (dispatcher: Dispatcher.DispatcherShape): ReadonlyArray<Model> =>
  dispatcher.presets.map((preset) => ({
    id: preset.id,
    object: "model",
    created: preset.created,
    owned_by: preset.ownedBy,
    capabilities: {
      streaming: true,
      json_mode: true,
      vision: preset.vision && dispatcher.nodesFor(preset.id).some((n) => n.vision),
      max_context_tokens: preset.maxContextTokens,
      max_output_tokens: preset.maxOutputTokens,
    },
  }))

// Declared once, not made per call (HttpServer.ts says why).
function* listBody<E, R>(authenticate: Effect.Effect<unknown, E, R>, res: ServerResponse, requestId: string) {
  yield* authenticate
  const dispatcher = yield* Dispatcher.Dispatcher
  res.writeHead(200, { "content-type": "application/json", [REQUEST_ID_HEADER]: requestId })
  res.end(JSON.stringify({ object: "list", data: models(dispatcher) }))
}

export const list = <E, R>(
  authenticate: Effect.Effect<unknown, E, R>,
  res: ServerResponse,
  requestId: string,
) => Effect.gen(() => listBody(authenticate, res, requestId))
