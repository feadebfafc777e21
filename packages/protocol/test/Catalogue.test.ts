/**
 * The error catalogue against spec §7.2/§7.3, row by row. The table below is
 * transcribed by hand from the spec (not derived from `src`), so a drift in
 * either place shows up here.
 */
import { readFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Schema } from "effect"
import fc from "fast-check"
import {
  AccountSuspended,
  type ApiError,
  CATALOGUE,
  type CatalogueError,
  catalogue,
  ErrorEnvelopeSchema,
  InternalError,
  InvalidRequest,
  isApiError,
  ModelNotFound,
  RateLimitExceeded,
  type RenderedError,
  renderError,
  retryAfterMax,
  streamErrorEvent,
  UnsupportedContentPart,
  UnsupportedMediaType,
  UpstreamError,
  UpstreamTimeout,
  ValidationFailed,
} from "../src/index"

type Retry = "Yes" | "No" | "see 7.3"

interface Row {
  readonly status: number
  readonly type: string
  readonly code: string
  readonly retry: Retry
}

// Spec §7.2, every row, in table order: HTTP | type | code | Retry.
const SPEC_TABLE: ReadonlyArray<Row> = [
  { status: 400, type: "invalid_request_error", code: "invalid_request", retry: "No" },
  { status: 400, type: "invalid_request_error", code: "unsupported_content_type", retry: "No" },
  { status: 400, type: "invalid_request_error", code: "zdr_storage_not_supported", retry: "No" },
  { status: 401, type: "invalid_request_error", code: "invalid_api_key", retry: "No" },
  { status: 402, type: "insufficient_quota", code: "payment_hold", retry: "No" },
  { status: 402, type: "insufficient_quota", code: "account_spend_limit_reached", retry: "No" },
  { status: 403, type: "permission_error", code: "account_suspended", retry: "No" },
  { status: 403, type: "permission_error", code: "account_restricted", retry: "No" },
  { status: 404, type: "invalid_request_error", code: "model_not_found", retry: "No" },
  { status: 408, type: "invalid_request_error", code: "request_timeout", retry: "No" },
  { status: 413, type: "invalid_request_error", code: "request_too_large", retry: "No" },
  { status: 415, type: "invalid_request_error", code: "unsupported_content_type", retry: "No" },
  { status: 429, type: "insufficient_quota", code: "insufficient_quota", retry: "No" },
  { status: 429, type: "rate_limit_error", code: "billing_limit_exceeded", retry: "No" },
  { status: 429, type: "rate_limit_error", code: "rate_limit_exceeded", retry: "Yes" },
  { status: 429, type: "rate_limit_error", code: "concurrency_limit_exceeded", retry: "Yes" },
  { status: 429, type: "server_error", code: "capacity_exhausted", retry: "Yes" },
  { status: 502, type: "server_error", code: "upstream_error", retry: "see 7.3" },
  { status: 503, type: "server_error", code: "admission_unavailable", retry: "Yes" },
  { status: 503, type: "server_error", code: "server_draining", retry: "Yes" },
  { status: 504, type: "server_error", code: "upstream_timeout", retry: "see 7.3" },
]

/** §7.3 rule 2 / §8: 3600 s for `rate_limit_exceeded`, 60 s for every other retryable code. */
const retryBound = (code: string): number => (code === "rate_limit_exceeded" ? 3600 : 60)

/** §4.2: an unknown `model` is a 404 about the `model` field. */
const FIXED_PARAM: Readonly<Record<string, string>> = { model_not_found: "model" }

const REQUEST_ID = "req_test"
const SAMPLE_PARAM = "messages"

type AnyCatalogueClass = (typeof catalogue)[number]
type Ctor = new (props: Record<string, unknown>) => CatalogueError

const hasField = (C: AnyCatalogueClass, field: string): boolean => Object.hasOwn(C.fields, field)

/** Builds an instance with exactly the fields its class declares. */
const build = (
  C: AnyCatalogueClass,
  opts: { message: string; retryAfterSeconds?: number },
): CatalogueError => {
  const props: Record<string, unknown> = { message: opts.message }
  if (hasField(C, "param")) props.param = SAMPLE_PARAM
  if (hasField(C, "retryAfterSeconds")) props.retryAfterSeconds = opts.retryAfterSeconds ?? 12.2
  return new (C as unknown as Ctor)(props)
}

const header = (r: RenderedError, name: string): string | undefined =>
  Object.entries(r.headers).find(([k]) => k.toLowerCase() === name)?.[1]

const retryAfterOf = (row: Row, seconds: number): string | undefined => {
  const C = catalogue[SPEC_TABLE.indexOf(row)]!
  return header(
    renderError(build(C, { message: "m", retryAfterSeconds: seconds }), REQUEST_ID),
    "retry-after",
  )
}

const retryable = SPEC_TABLE.filter((r) => r.retry === "Yes")

/** The README's error table, between its markers: `| HTTP | type | code | Retry-After | When |`. */
const readmeTable = () => {
  const readme = readFileSync(fileURLToPath(new URL("../../../README.md", import.meta.url)), "utf8")
  const block = readme.slice(
    readme.indexOf("<!-- error-table:start -->"),
    readme.indexOf("<!-- error-table:end -->"),
  )
  return block
    .split("\n")
    .filter((line) => /^\| \d{3} \|/.test(line))
    .map((line) => {
      const [status, type, code, retryAfter] = line
        .split("|")
        .slice(1)
        .map((cell) => cell.trim())
      return { status: Number(status), type, code, retryAfter }
    })
}

describe("catalogue vs spec §7.2", () => {
  it("the README's error table lists the catalogue, row for row, with the Retry-After bounds", () => {
    expect(readmeTable()).toEqual(
      Object.values(CATALOGUE).map((row) => {
        const max = retryAfterMax(row)
        return {
          status: row.status,
          type: row.type,
          code: row.code,
          retryAfter: max === undefined ? "—" : `1–${max}`,
        }
      }),
    )
  })

  it("the catalogue's data is the spec's table, row for row, and each class is made from its row", () => {
    const rows = Object.values(CATALOGUE)
    expect(rows.map(({ status, type, code, retry }) => ({ status, type, code, retry }))).toEqual(SPEC_TABLE)
    expect(catalogue.map((C) => C.row)).toEqual(rows)
    expect(catalogue.map((C) => C._tag)).toEqual(Object.keys(CATALOGUE))
  })

  it("an error made without a message carries its row's default message", () => {
    for (const C of catalogue) {
      const props: Record<string, unknown> = {}
      if (hasField(C, "param")) props.param = null
      if (hasField(C, "retryAfterSeconds")) props.retryAfterSeconds = 5
      const err = new (C as unknown as Ctor)(props)
      expect(err.message).toBe(C.row.message)
      expect(err.message.length).toBeGreaterThan(0)
      expect(JSON.parse(renderError(err, REQUEST_ID).body).error.message).toBe(C.row.message)
    }
  })

  it("has exactly one distinct class per table row (21)", () => {
    expect(SPEC_TABLE).toHaveLength(21)
    expect(catalogue).toHaveLength(SPEC_TABLE.length)
    expect(new Set(catalogue).size).toBe(catalogue.length)
    expect(new Set(catalogue.map((C) => C._tag)).size).toBe(catalogue.length)
  })

  it("each (status, code) pair of the table is unique, so table order pins one class per row", () => {
    const pairs = SPEC_TABLE.map((r) => `${r.status} ${r.code}`)
    expect(new Set(pairs).size).toBe(pairs.length)
  })

  it("the two unsupported_content_type rows are 400 UnsupportedContentPart and 415 UnsupportedMediaType", () => {
    const rows = SPEC_TABLE.flatMap((r, i) => (r.code === "unsupported_content_type" ? [i] : []))
    expect(rows.map((i) => SPEC_TABLE[i]!.status)).toEqual([400, 415])
    expect(rows.map((i) => catalogue[i])).toEqual([UnsupportedContentPart, UnsupportedMediaType])
    const part = renderError(new UnsupportedContentPart({ message: "audio", param: "messages" }), REQUEST_ID)
    const media = renderError(new UnsupportedMediaType({ message: "text/plain" }), REQUEST_ID)
    expect(part.status).toBe(400)
    expect(media.status).toBe(415)
    expect(JSON.parse(part.body).error.code).toBe("unsupported_content_type")
    expect(JSON.parse(media.body).error.code).toBe("unsupported_content_type")
  })

  SPEC_TABLE.forEach((row, i) => {
    describe(`row ${i + 1}: ${row.status} ${row.type} ${row.code} (retry ${row.retry})`, () => {
      const C = catalogue[i]!
      const message = `sample message for ${row.code}`
      const err = build(C, { message })
      const rendered = renderError(err, REQUEST_ID)

      it("instance carries the row's status, type and code", () => {
        expect(err.status).toBe(row.status)
        expect(err.type).toBe(row.type)
        expect(err.code).toBe(row.code)
        expect(isApiError(err)).toBe(true)
      })

      it("renders status, envelope body and headers", () => {
        expect(rendered.status).toBe(row.status)
        const expectedParam = FIXED_PARAM[row.code] ?? (hasField(C, "param") ? SAMPLE_PARAM : null)
        expect(JSON.parse(rendered.body)).toStrictEqual({
          error: { message, type: row.type, code: row.code, param: expectedParam },
          request_id: REQUEST_ID,
        })
        expect(header(rendered, "x-request-id")).toBe(REQUEST_ID)
        expect(header(rendered, "content-type")).toMatch(/^application\/json\b/)
        expect(header(rendered, "content-length")).toBe(String(Buffer.byteLength(rendered.body)))
        expect(
          Either.isRight(Schema.decodeUnknownEither(ErrorEnvelopeSchema)(JSON.parse(rendered.body))),
        ).toBe(true)
      })

      it(`retry-after header is ${row.retry === "Yes" ? "present" : "absent"}`, () => {
        const value = header(rendered, "retry-after")
        if (row.retry === "Yes") {
          expect(value).toBe("13") // 12.2 rounded up
          expect(err.retryAfter).toBe(13)
        } else {
          expect(value).toBeUndefined()
          expect(err.retryAfter).toBeUndefined()
        }
      })
    })
  })
})

describe("Retry-After bounds (spec §7.3, §8)", () => {
  it("there are exactly five retryable rows", () => {
    expect(retryable.map((r) => r.code)).toEqual([
      "rate_limit_exceeded",
      "concurrency_limit_exceeded",
      "capacity_exhausted",
      "admission_unavailable",
      "server_draining",
    ])
  })

  for (const row of retryable) {
    const max = retryBound(row.code)
    it(`${row.code}: rounds up, clamps to [1, ${max}]`, () => {
      expect(retryAfterOf(row, 12.2)).toBe("13")
      expect(retryAfterOf(row, 30)).toBe("30")
      expect(retryAfterOf(row, 59.01)).toBe("60")
      expect(retryAfterOf(row, 60)).toBe("60")
      expect(retryAfterOf(row, 500)).toBe(row.code === "rate_limit_exceeded" ? "500" : "60")
      expect(retryAfterOf(row, 3599.5)).toBe(row.code === "rate_limit_exceeded" ? "3600" : "60")
      expect(retryAfterOf(row, 10_000)).toBe(String(max))
      expect(retryAfterOf(row, 0)).toBe("1")
      expect(retryAfterOf(row, 0.001)).toBe("1")
      expect(retryAfterOf(row, -5)).toBe("1")
      expect(retryAfterOf(row, Number.POSITIVE_INFINITY)).toBe(String(max))
      const nan = Number(retryAfterOf(row, Number.NaN))
      expect(Number.isInteger(nan) && nan >= 1 && nan <= max).toBe(true)
    })

    it(`${row.code}: any number (incl. NaN/±Infinity) gives a whole number of seconds in [1, ${max}]`, () => {
      fc.assert(
        fc.property(fc.double(), (seconds) => {
          const value = retryAfterOf(row, seconds)
          expect(value).toMatch(/^[1-9][0-9]*$/)
          const n = Number(value)
          expect(n).toBeGreaterThanOrEqual(1)
          expect(n).toBeLessThanOrEqual(max)
          if (Number.isFinite(seconds) && seconds >= 1 && seconds <= max) {
            expect(n).toBe(Math.ceil(seconds))
          }
        }),
      )
    })
  }
})

describe("outside the table: 422 and 500", () => {
  it("ValidationFailed renders 422 with exactly {detail} and x-request-id, no envelope, no retry-after", () => {
    const detail = [
      { loc: ["body", "model"], msg: "Field required", type: "missing" },
      { loc: ["body", "messages", 0, "role"], msg: "Input should be ...", type: "literal_error" },
    ]
    const rendered = renderError(new ValidationFailed({ detail }), REQUEST_ID)
    expect(rendered.status).toBe(422)
    expect(JSON.parse(rendered.body)).toStrictEqual({ detail })
    expect(header(rendered, "content-length")).toBe(String(Buffer.byteLength(rendered.body)))
    expect(header(rendered, "x-request-id")).toBe(REQUEST_ID)
    expect(header(rendered, "content-type")).toMatch(/^application\/json\b/)
    expect(header(rendered, "retry-after")).toBeUndefined()
  })

  it("InternalError renders 500 server_error with the envelope and no retry-after", () => {
    const rendered = renderError(new InternalError({ message: "Internal server error" }), REQUEST_ID)
    expect(rendered.status).toBe(500)
    const body = JSON.parse(rendered.body)
    expect(body.error.type).toBe("server_error")
    expect(body.error.message).toBe("Internal server error")
    expect(body.error.param).toBeNull()
    expect(body.request_id).toBe(REQUEST_ID)
    expect(Either.isRight(Schema.decodeUnknownEither(ErrorEnvelopeSchema)(body))).toBe(true)
    expect(header(rendered, "x-request-id")).toBe(REQUEST_ID)
    expect(header(rendered, "retry-after")).toBeUndefined()
  })
})

describe("streamErrorEvent (spec §6)", () => {
  it("carries message, type, code and request_id, and no `param` key at all", () => {
    const event = JSON.parse(streamErrorEvent(new UpstreamError({ message: "node went away" }), "req_s"))
    expect(event).toStrictEqual({
      error: { message: "node went away", type: "server_error", code: "upstream_error" },
      request_id: "req_s",
    })
    expect(Object.hasOwn(event.error, "param")).toBe(false)
  })

  it("drops `param` even when the error has one", () => {
    const withParam = new InvalidRequest({ message: "x", param: "messages" })
    expect(withParam.param).toBe("messages")
    const event = JSON.parse(streamErrorEvent(withParam, "req_s"))
    expect(Object.hasOwn(event.error, "param")).toBe(false)
    expect(event.error.code).toBe("invalid_request")
  })

  it("works for upstream_timeout too", () => {
    const event = JSON.parse(streamErrorEvent(new UpstreamTimeout({ message: "too long" }), "req_t"))
    expect(event.error.code).toBe("upstream_timeout")
    expect(Object.keys(event.error).sort()).toEqual(["code", "message", "type"])
  })
})

describe("isApiError", () => {
  it("recognises every catalogue error, ValidationFailed and InternalError", () => {
    const all: Array<ApiError> = [
      ...catalogue.map((C) => build(C, { message: "m" })),
      new ValidationFailed({ detail: [] }),
      new InternalError({ message: "m" }),
    ]
    expect(all).toHaveLength(23)
    for (const e of all) expect(isApiError(e)).toBe(true)
  })

  it("rejects plain Errors and non-errors", () => {
    for (const u of [
      new Error("boom"),
      new TypeError("boom"),
      Object.assign(new Error("tagged"), { _tag: "SomethingElse" }),
      { _tag: "NoSuchError" },
      {},
      null,
      undefined,
      "InvalidRequest",
      42,
    ]) {
      expect(isApiError(u)).toBe(false)
    }
  })
})

describe("usage with Effect", () => {
  it.effect("a handler fails with a catalogue error; the error channel renders it", () =>
    Effect.gen(function* () {
      const handler = (model: string): Effect.Effect<string, ModelNotFound> =>
        model === "brand-prime" ? Effect.succeed("ok") : Effect.fail(ModelNotFound.forModel(model))
      const rendered = yield* handler("gpt-x").pipe(
        Effect.map((): RenderedError | undefined => undefined),
        Effect.catchAll((e) => Effect.succeed(renderError(e, REQUEST_ID))),
      )
      expect(rendered?.status).toBe(404)
      expect(JSON.parse(rendered!.body).error).toStrictEqual({
        message: "The model 'gpt-x' does not exist or is not available.",
        type: "invalid_request_error",
        code: "model_not_found",
        param: "model",
      })
    }),
  )

  it.effect("errors are yieldable and keep their class through Effect.flip", () =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(
        Effect.gen(function* () {
          yield* new RateLimitExceeded({ message: "slow down", retryAfterSeconds: 7200 })
        }),
      )
      expect(e).toBeInstanceOf(RateLimitExceeded)
      expect(header(renderError(e, REQUEST_ID), "retry-after")).toBe("3600")
      const suspended = yield* Effect.flip(new AccountSuspended({ message: "suspended" }))
      expect(renderError(suspended, REQUEST_ID).status).toBe(403)
    }),
  )
})
