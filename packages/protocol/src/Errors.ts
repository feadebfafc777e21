/**
 * The error catalogue of spec §7.2: one tagged error per row, each knowing how it
 * is rendered. Handlers fail with these; only `Render` turns them into bytes.
 */
import { Schema } from "effect"

export type ErrorType =
  | "invalid_request_error"
  | "insufficient_quota"
  | "permission_error"
  | "rate_limit_error"
  | "server_error"

/** What the renderer needs from any wire error. */
export interface WireError {
  readonly _tag: string
  readonly status: number
  readonly type: ErrorType
  readonly code: string
  readonly message: string
  readonly param: string | null
  /** Seconds, present exactly on the retryable codes (spec §7.3 rule 1). */
  readonly retryAfter: number | undefined
}

/** Upper bound of `Retry-After` per spec §7.3 rule 2. */
export const RATE_LIMIT_MAX_RETRY_AFTER = 3600
export const OTHER_MAX_RETRY_AFTER = 60

/** Whole seconds, rounded up, at least 1, at most `max`. */
export const clampRetryAfter = (seconds: number, max: number): number => {
  if (!Number.isFinite(seconds)) return max
  return Math.min(max, Math.max(1, Math.ceil(seconds)))
}

const message = Schema.String
const param = Schema.NullOr(Schema.String)
const retryAfterSeconds = Schema.Number

// --- 400 ---------------------------------------------------------------------

export class InvalidRequest extends Schema.TaggedError<InvalidRequest>()("InvalidRequest", {
  message,
  param,
}) {
  get status() {
    return 400
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "invalid_request"
  }
  get retryAfter() {
    return undefined
  }
}

/** A content part that is not accepted (audio, file): 400, unlike the 415 for the header. */
export class UnsupportedContentPart extends Schema.TaggedError<UnsupportedContentPart>()(
  "UnsupportedContentPart",
  { message, param },
) {
  get status() {
    return 400
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "unsupported_content_type"
  }
  get retryAfter() {
    return undefined
  }
}

export class ZdrStorageNotSupported extends Schema.TaggedError<ZdrStorageNotSupported>()(
  "ZdrStorageNotSupported",
  { message, param },
) {
  get status() {
    return 400
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "zdr_storage_not_supported"
  }
  get retryAfter() {
    return undefined
  }
}

// --- 401 / 402 / 403 ---------------------------------------------------------

export class InvalidApiKey extends Schema.TaggedError<InvalidApiKey>()("InvalidApiKey", {
  message,
  /** A key was sent (and refused); false when none was: RFC 6750 §3 answers the two differently. */
  keySent: Schema.optionalWith(Schema.Boolean, { default: () => true }),
}) {
  get status() {
    return 401
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "invalid_api_key"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class PaymentHold extends Schema.TaggedError<PaymentHold>()("PaymentHold", { message }) {
  get status() {
    return 402
  }
  get type(): ErrorType {
    return "insufficient_quota"
  }
  get code() {
    return "payment_hold"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class AccountSpendLimitReached extends Schema.TaggedError<AccountSpendLimitReached>()(
  "AccountSpendLimitReached",
  { message },
) {
  get status() {
    return 402
  }
  get type(): ErrorType {
    return "insufficient_quota"
  }
  get code() {
    return "account_spend_limit_reached"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class AccountSuspended extends Schema.TaggedError<AccountSuspended>()("AccountSuspended", {
  message,
}) {
  get status() {
    return 403
  }
  get type(): ErrorType {
    return "permission_error"
  }
  get code() {
    return "account_suspended"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class AccountRestricted extends Schema.TaggedError<AccountRestricted>()("AccountRestricted", {
  message,
}) {
  get status() {
    return 403
  }
  get type(): ErrorType {
    return "permission_error"
  }
  get code() {
    return "account_restricted"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

// --- 404 / 408 / 413 / 415 ---------------------------------------------------

export class ModelNotFound extends Schema.TaggedError<ModelNotFound>()("ModelNotFound", { message }) {
  static readonly forModel = (model: string) =>
    new ModelNotFound({ message: `The model '${model.slice(0, 200)}' does not exist or is not available.` })
  get status() {
    return 404
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "model_not_found"
  }
  get param() {
    return "model"
  }
  get retryAfter() {
    return undefined
  }
}

export class RequestTimeout extends Schema.TaggedError<RequestTimeout>()("RequestTimeout", { message }) {
  get status() {
    return 408
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "request_timeout"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class RequestTooLarge extends Schema.TaggedError<RequestTooLarge>()("RequestTooLarge", {
  message,
  param,
}) {
  get status() {
    return 413
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "request_too_large"
  }
  get retryAfter() {
    return undefined
  }
}

/** `Content-Type` is not `application/json`: 415, same code as the 400 content-part error. */
export class UnsupportedMediaType extends Schema.TaggedError<UnsupportedMediaType>()("UnsupportedMediaType", {
  message,
}) {
  get status() {
    return 415
  }
  get type(): ErrorType {
    return "invalid_request_error"
  }
  get code() {
    return "unsupported_content_type"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

// --- 429 -----------------------------------------------------------------------

export class InsufficientQuota extends Schema.TaggedError<InsufficientQuota>()("InsufficientQuota", {
  message,
}) {
  get status() {
    return 429
  }
  get type(): ErrorType {
    return "insufficient_quota"
  }
  get code() {
    return "insufficient_quota"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class BillingLimitExceeded extends Schema.TaggedError<BillingLimitExceeded>()("BillingLimitExceeded", {
  message,
}) {
  get status() {
    return 429
  }
  get type(): ErrorType {
    return "rate_limit_error"
  }
  get code() {
    return "billing_limit_exceeded"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class RateLimitExceeded extends Schema.TaggedError<RateLimitExceeded>()("RateLimitExceeded", {
  message,
  retryAfterSeconds,
}) {
  get status() {
    return 429
  }
  get type(): ErrorType {
    return "rate_limit_error"
  }
  get code() {
    return "rate_limit_exceeded"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return clampRetryAfter(this.retryAfterSeconds, RATE_LIMIT_MAX_RETRY_AFTER)
  }
}

export class ConcurrencyLimitExceeded extends Schema.TaggedError<ConcurrencyLimitExceeded>()(
  "ConcurrencyLimitExceeded",
  { message, retryAfterSeconds },
) {
  get status() {
    return 429
  }
  get type(): ErrorType {
    return "rate_limit_error"
  }
  get code() {
    return "concurrency_limit_exceeded"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return clampRetryAfter(this.retryAfterSeconds, OTHER_MAX_RETRY_AFTER)
  }
}

export class CapacityExhausted extends Schema.TaggedError<CapacityExhausted>()("CapacityExhausted", {
  message,
  retryAfterSeconds,
}) {
  get status() {
    return 429
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "capacity_exhausted"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return clampRetryAfter(this.retryAfterSeconds, OTHER_MAX_RETRY_AFTER)
  }
}

// --- 5xx -----------------------------------------------------------------------

/** After the request started (spec §7.3 rule 5): may be charged for what ran; no Retry-After. */
export class UpstreamError extends Schema.TaggedError<UpstreamError>()("UpstreamError", { message }) {
  get status() {
    return 502
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "upstream_error"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

export class AdmissionUnavailable extends Schema.TaggedError<AdmissionUnavailable>()("AdmissionUnavailable", {
  message,
  retryAfterSeconds,
}) {
  get status() {
    return 503
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "admission_unavailable"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return clampRetryAfter(this.retryAfterSeconds, OTHER_MAX_RETRY_AFTER)
  }
}

export class ServerDraining extends Schema.TaggedError<ServerDraining>()("ServerDraining", {
  message,
  retryAfterSeconds,
}) {
  get status() {
    return 503
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "server_draining"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return clampRetryAfter(this.retryAfterSeconds, OTHER_MAX_RETRY_AFTER)
  }
}

export class UpstreamTimeout extends Schema.TaggedError<UpstreamTimeout>()("UpstreamTimeout", { message }) {
  get status() {
    return 504
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "upstream_timeout"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

// --- outside the table: 422 and 500 ---------------------------------------------

export const ValidationDetail = Schema.Struct({
  loc: Schema.Array(Schema.Union(Schema.String, Schema.Number)),
  msg: Schema.String,
  type: Schema.String,
})
export type ValidationDetail = typeof ValidationDetail.Type

/** 422 with the `detail` body of spec §2.6 instead of the envelope. */
export class ValidationFailed extends Schema.TaggedError<ValidationFailed>()("ValidationFailed", {
  detail: Schema.Array(ValidationDetail),
}) {
  get status() {
    return 422
  }
}

/** 500: an internal failure, never with internals in the message. */
export class InternalError extends Schema.TaggedError<InternalError>()("InternalError", { message }) {
  get status() {
    return 500
  }
  get type(): ErrorType {
    return "server_error"
  }
  get code() {
    return "internal_error"
  }
  get param() {
    return null
  }
  get retryAfter() {
    return undefined
  }
}

/** Every row of spec §7.2, in table order. */
export const catalogue = [
  InvalidRequest,
  UnsupportedContentPart,
  ZdrStorageNotSupported,
  InvalidApiKey,
  PaymentHold,
  AccountSpendLimitReached,
  AccountSuspended,
  AccountRestricted,
  ModelNotFound,
  RequestTimeout,
  RequestTooLarge,
  UnsupportedMediaType,
  InsufficientQuota,
  BillingLimitExceeded,
  RateLimitExceeded,
  ConcurrencyLimitExceeded,
  CapacityExhausted,
  UpstreamError,
  AdmissionUnavailable,
  ServerDraining,
  UpstreamTimeout,
] as const

export type CatalogueError = InstanceType<(typeof catalogue)[number]>
/** Anything the request path may fail with on the wire. */
export type ApiError = CatalogueError | ValidationFailed | InternalError

const apiErrorTags: ReadonlySet<string> = new Set([
  ...catalogue.map((c) => c._tag),
  ValidationFailed._tag,
  InternalError._tag,
])

export const isApiError = (u: unknown): u is ApiError =>
  typeof u === "object" && u !== null && "_tag" in u && apiErrorTags.has((u as { _tag: string })._tag)
