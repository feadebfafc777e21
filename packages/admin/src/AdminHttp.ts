/**
 * The admin API on the gateway's server: `/admin/v1/…` behind the admin
 * token (compared in constant time), bodies read within the gateway's
 * limits, answers as JSON. Provided to the gateway as its `SideRoutes`.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import type { Dispatcher } from "@swarmgate/dispatch"
import { GatewayConfig, HttpIo, SideRoutes } from "@swarmgate/gateway"
import { Effect, Layer, Option, Redacted } from "effect"
import * as AccountLifecycle from "./AccountLifecycle"
import { type AdminServices, handleAdmin } from "./Admin"
import * as AdminNodes from "./AdminNodes"
import * as Console from "./Console"
import * as ConsoleSession from "./ConsoleSession"
import * as Mail from "./Mail"
import * as PublicPages from "./PublicPages"

export const ADMIN_PREFIX = "/admin/v1/"

/** What the admin surface needs from the server's services (billing and limits are used when present). */
export type AdminHttpServices = AdminServices | Dispatcher.Dispatcher | GatewayConfig.GatewayConfig

/** What the server provides; the mailer is made here. */
export type AdminHttpRequirements =
  | Exclude<AdminHttpServices, Mail.Mailer>
  | Layer.Layer.Context<typeof Mail.layer>

export const adminAuthorized = (req: IncomingMessage, token: Redacted.Redacted) =>
  ConsoleSession.sameSecret(req.headers.authorization ?? "", `Bearer ${Redacted.value(token)}`)

/** `/admin/v1/<segments>`: 404 without an admin token configured, 401 with a wrong one. */
export const admin = (
  req: IncomingMessage,
  res: ServerResponse,
  segments: ReadonlyArray<string>,
  startedAt: number,
) =>
  Effect.gen(function* () {
    const config = yield* GatewayConfig.GatewayConfig
    if (Option.isNone(config.adminToken)) return HttpIo.empty(res, 404)
    if (!adminAuthorized(req, config.adminToken.value)) {
      HttpIo.closeAfterUnreadBody(req, res)
      return HttpIo.sendJson(res, 401, {
        error: {
          message: "Admin API: send 'Authorization: Bearer $SWARMGATE_ADMIN_TOKEN'.",
          type: "invalid_request_error",
          code: "invalid_admin_token",
          param: null,
        },
      })
    }
    let body: unknown
    if (req.method === "POST" || req.method === "PATCH") {
      const buffer = yield* HttpIo.readBody(req, config, startedAt)
      if (buffer.length > 0) body = yield* HttpIo.parseJson(buffer)
    }
    const url = req.url ?? "/"
    const q = url.indexOf("?")
    const response =
      segments[0] === "nodes"
        ? yield* AdminNodes.handle(req.method ?? "GET", segments.slice(1), body)
        : yield* handleAdmin({
            method: req.method ?? "GET",
            segments,
            query: new URLSearchParams(q < 0 ? "" : url.slice(q + 1)),
            body,
          })
    if (response.body === undefined) return HttpIo.empty(res, response.status)
    HttpIo.sendJson(res, response.status, response.body)
  })

const allowed = (methods: ReadonlyArray<string>, method: string): SideRoutes.Route | undefined =>
  methods.includes(method) || (method === "HEAD" && methods.includes("GET"))
    ? undefined
    : { _tag: "Empty", status: 405, allow: methods.join(", ") }

/** The admin API, the application pages and the console over the services in context (captured once). */
export const make = Effect.map(
  Effect.context<AdminHttpServices>(),
  (context): SideRoutes.SideRoutesShape => ({
    route: (req, res, path, startedAt) => {
      const run = (effect: Effect.Effect<unknown, unknown, AdminHttpServices>): SideRoutes.Route => ({
        _tag: "Run",
        effect: Effect.provide(effect, context),
      })
      if (path.startsWith(ADMIN_PREFIX))
        return run(admin(req, res, HttpIo.segmentsAfter(ADMIN_PREFIX, path), startedAt))
      if (path === Console.CONSOLE_PREFIX || path.startsWith(`${Console.CONSOLE_PREFIX}/`))
        return run(Console.handle(req, res, path, startedAt))
      const methods = PublicPages.PUBLIC_PATHS[path]
      if (methods !== undefined)
        return allowed(methods, req.method ?? "GET") ?? run(PublicPages.handle(req, res, path, startedAt))
      return undefined
    },
    serves: (method, path) =>
      path.startsWith("/admin/") ||
      path === Console.CONSOLE_PREFIX ||
      path.startsWith(`${Console.CONSOLE_PREFIX}/`) ||
      (PublicPages.PUBLIC_PATHS[path]?.includes(method) ?? false),
  }),
)

/** The routes, over the closer of closing accounts (a close here wakes it) and the mailer they share. */
export const layer: Layer.Layer<SideRoutes.SideRoutes, never, AdminHttpRequirements> = Layer.effect(
  SideRoutes.SideRoutes,
  make,
).pipe(Layer.provide(AccountLifecycle.closerLayer), Layer.provide(Mail.layer))
