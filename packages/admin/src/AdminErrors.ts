/**
 * The admin surfaces' own refusals (not §7.2 codes: the admin API is ours)
 * and the one envelope they are answered in, shared by the admin API, the
 * application pages and the console.
 */
import type { Repository } from "@swarmgate/auth"
import { AdmissionUnavailable, type CatalogueRow, type InvalidRequest, wire } from "@swarmgate/protocol"
import { Effect } from "effect"

export interface AdminResponse {
  readonly status: number
  /** Serialised as JSON by the server; undefined means an empty body. */
  readonly body: unknown
}

/** The admin surfaces' own rows, in the catalogue's form (they are not §7.2 codes). */
// biome-ignore format: one line per row, like the catalogue
export const ADMIN_ROWS = {
  NotFound: { status: 404, type: "invalid_request_error", code: "not_found", retry: "No", message: "Not found." },
  Conflict: { status: 409, type: "invalid_request_error", code: "conflict", retry: "No", message: "The change conflicts with the current state." },
} as const satisfies Record<string, CatalogueRow>

/** An account, key or application that does not exist. */
export class AdminNotFound extends wire<AdminNotFound>()("AdminNotFound", ADMIN_ROWS.NotFound, {}) {}

/** The thing exists but its state forbids the change (approving a decided application, changing a closed account). */
export class AdminConflict extends wire<AdminConflict>()("AdminConflict", ADMIN_ROWS.Conflict, {}) {}

export type AdminError = InvalidRequest | AdminNotFound | AdminConflict | AdmissionUnavailable

export const errorBody = (error: AdminError) => ({
  error: { message: error.message, type: error.type, code: error.code, param: error.param },
})

export const errorResponse = (error: AdminError): AdminResponse => ({
  status: error.status,
  body: errorBody(error),
})

export const storeUnavailable = new AdmissionUnavailable({
  message: "The account store is unavailable; try again shortly.",
  retryAfterSeconds: 1,
})

export const fromRepository = <A, R>(
  effect: Effect.Effect<A, Repository.NotFound | Repository.RepositoryUnavailable, R>,
): Effect.Effect<A, AdminNotFound | AdmissionUnavailable, R> =>
  Effect.catchTags(effect, {
    NotFound: (e) => Effect.fail(new AdminNotFound({ message: `No ${e.entity} with id '${e.id}'.` })),
    RepositoryUnavailable: () => Effect.fail(storeUnavailable),
  })

export const fromSql = <A, R>(
  effect: Effect.Effect<A, unknown, R>,
): Effect.Effect<A, AdmissionUnavailable, R> => Effect.catchAll(effect, () => Effect.fail(storeUnavailable))

/** Only storage failures become 503; the effect's own refusals pass through. */
export const catchSql = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
): Effect.Effect<A, Exclude<E, { readonly _tag: "SqlError" }> | AdmissionUnavailable, R> =>
  Effect.catchIf(
    effect,
    (e): e is Extract<E, { readonly _tag: "SqlError" }> =>
      typeof e === "object" && e !== null && "_tag" in e && e._tag === "SqlError",
    () => Effect.fail(storeUnavailable),
  ) as Effect.Effect<A, Exclude<E, { readonly _tag: "SqlError" }> | AdmissionUnavailable, R>
