/**
 * The one place where an error becomes a response: status, headers and body.
 */
import type { ApiError, CatalogueError } from "./Errors"

export interface RenderedError {
  readonly status: number
  readonly headers: Record<string, string>
  readonly body: string
}

export interface ErrorEnvelope {
  readonly error: {
    readonly message: string
    readonly type: string
    readonly code: string
    readonly param: string | null
  }
  readonly request_id: string
}

export const REQUEST_ID_HEADER = "x-request-id"

export const errorEnvelope = (
  error: CatalogueError | Exclude<ApiError, { _tag: "ValidationFailed" }>,
  requestId: string,
): ErrorEnvelope => ({
  error: { message: error.message, type: error.type, code: error.code, param: error.param },
  request_id: requestId,
})

/**
 * The status, headers (with `content-length`) and body of a refusal. The
 * headers are a new object the caller may add to (`connection: close`): a
 * copy made by spreading them plus one more header cost ~0.8 µs in V8 and
 * left garbage in the old generation (docs/ARCHITECTURE.md, "Object spread").
 */
export const renderError = (error: ApiError, requestId: string): RenderedError => {
  if (error._tag === "ValidationFailed") {
    const body = JSON.stringify({ detail: error.detail })
    return { status: 422, headers: errorHeaders(requestId, body), body }
  }
  const body = JSON.stringify(errorEnvelope(error, requestId))
  const headers = errorHeaders(requestId, body)
  const retryAfter = error.retryAfter
  if (retryAfter !== undefined) headers["retry-after"] = String(retryAfter)
  // RFC 6750 section 3: every 401 names the scheme; invalid_token when a key was sent and refused.
  if (error._tag === "InvalidApiKey")
    headers["www-authenticate"] = error.keySent
      ? `Bearer realm="swarmgate", error="invalid_token"`
      : `Bearer realm="swarmgate"`
  return { status: error.status, headers, body }
}

const errorHeaders = (requestId: string, body: string): Record<string, string> => ({
  "content-type": "application/json",
  "content-length": String(Buffer.byteLength(body)),
  [REQUEST_ID_HEADER]: requestId,
})

/**
 * The last SSE event of a stream that failed after it started (spec §6):
 * code `upstream_error` (or `upstream_timeout`), and no `param` field at all.
 */
export const streamErrorEvent = (
  error: { readonly message: string; readonly type: string; readonly code: string },
  requestId: string,
): string =>
  JSON.stringify({
    error: { message: error.message, type: error.type, code: error.code },
    request_id: requestId,
  })
