/**
 * The admin surfaces' own refusals (not §7.2 codes: the admin API is ours)
 * and the one envelope they are answered in, shared by the admin API, the
 * application pages and the console.
 */
import type { Repository } from "@swarmgate/auth"
import { AdmissionUnavailable, type ErrorType, type InvalidRequest } from "@swarmgate/protocol"
import { Effect, Schema } from "effect"

export interface AdminResponse {
  readonly status: number
  /** Serialised as JSON by the server; undefined means an empty body. */
  readonly body: unknown
}

/** An account or key that does not exist; admin-only, so not part of the §7.2 catalogue. */
export class AdminNotFound extends Schema.TaggedError<AdminNotFound>()("AdminNotFound", {
  message: Schema.String,
}) {
  get status() {
    return 404
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "not_found"
  }
  get param() {
    return null
  }
}

/** The thing exists but is in a state that forbids the change (approving a decided application). */
export class AdminConflict extends Schema.TaggedError<AdminConflict>()("AdminConflict", {
  message: Schema.String,
}) {
  get status() {
    return 409
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "conflict"
  }
  get param() {
    return null
  }
}

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
