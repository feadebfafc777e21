/**
 * The error catalogue of spec §7.2 as data: one row per code (status, type,
 * code, retryability, default message), and one tagged error class per row
 * made from it. Handlers fail with these; only `Encode` turns them into bytes.
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

/** Spec §7.2's Retry column: "see 7.3" rows are retried only under rule 5 (failed before anything ran). */
export type Retry = "Yes" | "No" | "see 7.3"

/** One row of spec §7.2. */
export interface CatalogueRow {
  readonly status: number
  readonly type: ErrorType
  readonly code: string
  readonly retry: Retry
  /** The `param` every error of the row names (spec §4.2: `model`); absent: given per error, or null. */
  readonly param?: string
  /** The message when the error is made without one. */
  readonly message: string
}

/** Spec §7.2, every row in table order: adding a code is one line here and one class below. */
// biome-ignore format: one line per row, like the spec's table
export const CATALOGUE = {
  InvalidRequest: { status: 400, type: "invalid_request_error", code: "invalid_request", retry: "No", message: "The request is invalid." },
  UnsupportedContentPart: { status: 400, type: "invalid_request_error", code: "unsupported_content_type", retry: "No", message: "This content part type is not supported." },
  ZdrStorageNotSupported: { status: 400, type: "invalid_request_error", code: "zdr_storage_not_supported", retry: "No", message: "This service does not store completions." },
  InvalidApiKey: { status: 401, type: "invalid_request_error", code: "invalid_api_key", retry: "No", message: "Invalid API key." },
  PaymentHold: { status: 402, type: "insufficient_quota", code: "payment_hold", retry: "No", message: "The account's credit is on hold after a payment dispute." },
  AccountSpendLimitReached: { status: 402, type: "insufficient_quota", code: "account_spend_limit_reached", retry: "No", message: "The account's monthly spend limit is reached." },
  AccountSuspended: { status: 403, type: "permission_error", code: "account_suspended", retry: "No", message: "The account is suspended." },
  AccountRestricted: { status: 403, type: "permission_error", code: "account_restricted", retry: "No", message: "The account is restricted." },
  ModelNotFound: { status: 404, type: "invalid_request_error", code: "model_not_found", retry: "No", param: "model", message: "The model does not exist or is not available." },
  RequestTimeout: { status: 408, type: "invalid_request_error", code: "request_timeout", retry: "No", message: "The request body did not arrive in time." },
  RequestTooLarge: { status: 413, type: "invalid_request_error", code: "request_too_large", retry: "No", message: "The request is too large." },
  UnsupportedMediaType: { status: 415, type: "invalid_request_error", code: "unsupported_content_type", retry: "No", message: "Content-Type must be application/json." },
  InsufficientQuota: { status: 429, type: "insufficient_quota", code: "insufficient_quota", retry: "No", message: "The account balance is spent." },
  BillingLimitExceeded: { status: 429, type: "rate_limit_error", code: "billing_limit_exceeded", retry: "No", message: "This key's spend limit is reached." },
  RateLimitExceeded: { status: 429, type: "rate_limit_error", code: "rate_limit_exceeded", retry: "Yes", message: "Rate limit exceeded." },
  ConcurrencyLimitExceeded: { status: 429, type: "rate_limit_error", code: "concurrency_limit_exceeded", retry: "Yes", message: "Too many requests are running for this account." },
  CapacityExhausted: { status: 429, type: "server_error", code: "capacity_exhausted", retry: "Yes", message: "No node can take the request now." },
  UpstreamError: { status: 502, type: "server_error", code: "upstream_error", retry: "see 7.3", message: "The node failed." },
  AdmissionUnavailable: { status: 503, type: "server_error", code: "admission_unavailable", retry: "Yes", message: "The service cannot accept the request now." },
  ServerDraining: { status: 503, type: "server_error", code: "server_draining", retry: "Yes", message: "The server is shutting down." },
  UpstreamTimeout: { status: 504, type: "server_error", code: "upstream_timeout", retry: "see 7.3", message: "The request reached its running-time limit." },
} as const satisfies Record<string, CatalogueRow>

/** Outside the table: any failure the catalogue does not name (never with internals in the message). */
export const INTERNAL_ERROR_ROW = {
  status: 500,
  type: "server_error",
  code: "internal_error",
  retry: "No",
  message: "The server failed to answer the request.",
} as const satisfies CatalogueRow

/** Spec §7.3 rule 2 / §8: the bound of a retryable row's `Retry-After`. */
export const retryAfterMax = (row: CatalogueRow): number | undefined =>
  row.retry !== "Yes"
    ? undefined
    : row.code === "rate_limit_exceeded"
      ? RATE_LIMIT_MAX_RETRY_AFTER
      : OTHER_MAX_RETRY_AFTER

const param = Schema.NullOr(Schema.String)
const retryAfterSeconds = Schema.Number

type WireClass<Self, Tag extends string, F extends Schema.Struct.Fields> = Schema.TaggedErrorClass<
  Self,
  Tag,
  { readonly _tag: Schema.tag<Tag> } & {
    readonly message: Schema.optionalWith<typeof Schema.String, { default: () => string }>
  } & F
> & {
  readonly row: CatalogueRow
  // biome-ignore lint/suspicious/noExplicitAny: the Schema class's own constructor types the arguments
  new (...args: ReadonlyArray<any>): Omit<WireError, "_tag" | "message">
}

/**
 * The tagged error class of one catalogue row: `message` (defaulting to the
 * row's), the row's fields as getters, and `fields` besides (`param` when
 * each error names its own, `retryAfterSeconds` on retryable rows).
 */
export const wire =
  <Self>() =>
  <const Tag extends string, F extends Schema.Struct.Fields>(
    tag: Tag,
    row: CatalogueRow,
    fields: F,
  ): WireClass<Self, Tag, F> => {
    // Typed at the end: TypeScript cannot extend a class whose fields are still a type parameter.
    const Base = Schema.TaggedError<{ readonly _tag: Tag }>()(tag, {
      message: Schema.optionalWith(Schema.String, { default: () => row.message }),
      ...fields,
    }) as unknown as new (
      props: unknown,
    ) => { readonly retryAfterSeconds?: number }
    const max = retryAfterMax(row)
    class Row extends Base {
      static readonly row = row
      get status() {
        return row.status
      }
      get type() {
        return row.type
      }
      get code() {
        return row.code
      }
      get retryAfter(): number | undefined {
        return max === undefined
          ? undefined
          : clampRetryAfter((this as { retryAfterSeconds?: number }).retryAfterSeconds ?? 1, max)
      }
    }
    // A row whose errors name their own `param` has it as a field; the others answer the row's.
    if (!("param" in fields))
      Object.defineProperty(Row.prototype, "param", { get: () => row.param ?? null, configurable: true })
    return Row as unknown as WireClass<Self, Tag, F>
  }

// --- 400 ---------------------------------------------------------------------

export class InvalidRequest extends wire<InvalidRequest>()("InvalidRequest", CATALOGUE.InvalidRequest, {
  param,
}) {}
/** A content part that is not accepted (audio, file): 400, unlike the 415 for the header. */
export class UnsupportedContentPart extends wire<UnsupportedContentPart>()(
  "UnsupportedContentPart",
  CATALOGUE.UnsupportedContentPart,
  { param },
) {}
export class ZdrStorageNotSupported extends wire<ZdrStorageNotSupported>()(
  "ZdrStorageNotSupported",
  CATALOGUE.ZdrStorageNotSupported,
  { param },
) {}

// --- 401 / 402 / 403 ---------------------------------------------------------

export class InvalidApiKey extends wire<InvalidApiKey>()("InvalidApiKey", CATALOGUE.InvalidApiKey, {
  /** A key was sent (and refused); false when none was: RFC 6750 §3 answers the two differently. */
  keySent: Schema.optionalWith(Schema.Boolean, { default: () => true }),
}) {}
export class PaymentHold extends wire<PaymentHold>()("PaymentHold", CATALOGUE.PaymentHold, {}) {}
export class AccountSpendLimitReached extends wire<AccountSpendLimitReached>()(
  "AccountSpendLimitReached",
  CATALOGUE.AccountSpendLimitReached,
  {},
) {}
export class AccountSuspended extends wire<AccountSuspended>()(
  "AccountSuspended",
  CATALOGUE.AccountSuspended,
  {},
) {}
export class AccountRestricted extends wire<AccountRestricted>()(
  "AccountRestricted",
  CATALOGUE.AccountRestricted,
  {},
) {}

// --- 404 / 408 / 413 / 415 ---------------------------------------------------

export class ModelNotFound extends wire<ModelNotFound>()("ModelNotFound", CATALOGUE.ModelNotFound, {}) {
  static readonly forModel = (model: string) =>
    new ModelNotFound({ message: `The model '${model.slice(0, 200)}' does not exist or is not available.` })
}
export class RequestTimeout extends wire<RequestTimeout>()("RequestTimeout", CATALOGUE.RequestTimeout, {}) {}
export class RequestTooLarge extends wire<RequestTooLarge>()("RequestTooLarge", CATALOGUE.RequestTooLarge, {
  param,
}) {}
/** `Content-Type` is not `application/json`: 415, same code as the 400 content-part error. */
export class UnsupportedMediaType extends wire<UnsupportedMediaType>()(
  "UnsupportedMediaType",
  CATALOGUE.UnsupportedMediaType,
  {},
) {}

// --- 429 -----------------------------------------------------------------------

export class InsufficientQuota extends wire<InsufficientQuota>()(
  "InsufficientQuota",
  CATALOGUE.InsufficientQuota,
  {},
) {}
export class BillingLimitExceeded extends wire<BillingLimitExceeded>()(
  "BillingLimitExceeded",
  CATALOGUE.BillingLimitExceeded,
  {},
) {}
export class RateLimitExceeded extends wire<RateLimitExceeded>()(
  "RateLimitExceeded",
  CATALOGUE.RateLimitExceeded,
  { retryAfterSeconds },
) {}
export class ConcurrencyLimitExceeded extends wire<ConcurrencyLimitExceeded>()(
  "ConcurrencyLimitExceeded",
  CATALOGUE.ConcurrencyLimitExceeded,
  { retryAfterSeconds },
) {}
export class CapacityExhausted extends wire<CapacityExhausted>()(
  "CapacityExhausted",
  CATALOGUE.CapacityExhausted,
  { retryAfterSeconds },
) {}

// --- 5xx -----------------------------------------------------------------------

/** After the request started (spec §7.3 rule 5): may be charged for what ran; no Retry-After. */
export class UpstreamError extends wire<UpstreamError>()("UpstreamError", CATALOGUE.UpstreamError, {}) {}
export class AdmissionUnavailable extends wire<AdmissionUnavailable>()(
  "AdmissionUnavailable",
  CATALOGUE.AdmissionUnavailable,
  { retryAfterSeconds },
) {}
export class ServerDraining extends wire<ServerDraining>()("ServerDraining", CATALOGUE.ServerDraining, {
  retryAfterSeconds,
}) {}
export class UpstreamTimeout extends wire<UpstreamTimeout>()(
  "UpstreamTimeout",
  CATALOGUE.UpstreamTimeout,
  {},
) {}

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
export class InternalError extends wire<InternalError>()("InternalError", INTERNAL_ERROR_ROW, {}) {}

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
