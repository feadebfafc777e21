/**
 * Routes outside `/v1` that another package serves on the same server (the
 * admin API, the application pages and the console of `@swarmgate/admin`).
 * The gateway keeps the request path; without this service every path
 * outside `/v1`, `/healthz`, `/readyz` and `/metrics` is an empty 404.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { Context, type Effect } from "effect"

/** What a route decided: an empty 404/405, or an effect that answers (its requirements already provided). */
export type Route =
  | { readonly _tag: "Empty"; readonly status: 404 | 405; readonly allow?: string }
  | { readonly _tag: "Run"; readonly effect: Effect.Effect<unknown, unknown> }

export interface SideRoutesShape {
  /**
   * The route for `path` (no query), or undefined when none here serves it.
   * A thrown error (a malformed percent-escape) is a 404.
   */
  readonly route: (
    req: IncomingMessage,
    res: ServerResponse,
    path: string,
    startedAt: number,
  ) => Route | undefined
  /** Whether a handler here serves `method` on `path`: while draining, those get 503, the rest 404/405. */
  readonly serves: (method: string, path: string) => boolean
}

export class SideRoutes extends Context.Tag("@swarmgate/gateway/SideRoutes")<SideRoutes, SideRoutesShape>() {}
