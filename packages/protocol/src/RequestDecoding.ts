/**
 * Decoding of the request body into `ChatCompletionRequest`, with shape errors
 * turned into the 422 `detail` entries of spec §2.6 (`loc` starts at "body").
 */
import { Either, type ParseResult, Predicate, Schema, SchemaAST } from "effect"
import { type ValidationDetail, ValidationFailed } from "./Errors"
import { ChatCompletionRequest, ImageUrlPart, TextPart } from "./Schemas"

type Loc = ReadonlyArray<string | number>

const typeName = (ast: SchemaAST.AST): { type: string; expected: string } => {
  switch (ast._tag) {
    case "StringKeyword":
      return { type: "string_type", expected: "a valid string" }
    case "NumberKeyword":
      return { type: "number_type", expected: "a valid number" }
    case "BooleanKeyword":
      return { type: "bool_type", expected: "a valid boolean" }
    case "Literal":
      return { type: "literal_error", expected: JSON.stringify(ast.literal) }
    case "TupleType":
      return { type: "list_type", expected: "a valid list" }
    case "TypeLiteral":
      return { type: "dict_type", expected: "a valid object" }
    case "Union": {
      const defined = ast.types.filter((t) => t._tag !== "UndefinedKeyword")
      if (defined.length === 1) return typeName(defined[0]!)
      const literals = ast.types.filter(SchemaAST.isLiteral).map((t) => JSON.stringify(t.literal))
      if (literals.length === ast.types.length)
        return { type: "literal_error", expected: literals.join(", ") }
      if (ast.types.some((t) => t._tag === "Literal" && t.literal === null)) {
        const inner = ast.types.find((t) => !(t._tag === "Literal" && t.literal === null))
        if (inner) return typeName(inner)
      }
      return { type: "union_type", expected: ast.types.map((t) => typeName(t).expected).join(" or ") }
    }
    case "Refinement":
      // Schema.Int is the only refinement in the request schema.
      return { type: "int_type", expected: "a valid integer" }
    default:
      return { type: "type_error", expected: "a valid value" }
  }
}

const describe = (value: unknown): string => {
  if (value === null) return "null"
  if (Array.isArray(value)) return "a list"
  if (typeof value === "string") return value.length > 40 ? "a string" : JSON.stringify(value)
  return typeof value === "object" ? "an object" : String(value)
}

const collect = (issue: ParseResult.ParseIssue, loc: Loc, out: Array<ValidationDetail>): void => {
  switch (issue._tag) {
    case "Pointer": {
      const path = Array.isArray(issue.path) ? issue.path : [issue.path]
      collect(issue.issue, [...loc, ...(path as Array<string | number>)], out)
      return
    }
    case "Missing":
      out.push({ loc, msg: "Field required", type: "missing" })
      return
    case "Type": {
      if (issue.ast._tag === "Refinement") {
        out.push({ loc, msg: issue.message ?? "Input should be a valid integer", type: "int_type" })
        return
      }
      const { expected, type } = typeName(issue.ast)
      out.push({ loc, msg: `Input should be ${expected}, got ${describe(issue.actual)}`, type })
      return
    }
    case "Refinement":
      if (issue.kind === "From") {
        collect(issue.issue, loc, out)
        return
      }
      out.push({ loc, msg: "Input should be a valid integer", type: "int_type" })
      return
    case "Transformation":
      collect(issue.issue, loc, out)
      return
    case "Composite": {
      const issues = Array.isArray(issue.issues) ? issue.issues : [issue.issues]
      if (issue.ast._tag === "Union") {
        // Prefer the member that got past its outer type (the one the client meant).
        const deeper = issues.filter(
          (i: ParseResult.ParseIssue) => i._tag === "Pointer" || i._tag === "Composite",
        )
        if (deeper.length > 0) {
          for (const i of deeper) collect(i, loc, out)
          return
        }
        const { expected, type } = typeName(issue.ast)
        out.push({ loc, msg: `Input should be ${expected}, got ${describe(issue.actual)}`, type })
        return
      }
      for (const i of issues) collect(i, loc, out)
      return
    }
    case "Unexpected":
      out.push({ loc, msg: "Extra inputs are not permitted", type: "extra_forbidden" })
      return
    case "Forbidden":
      out.push({ loc, msg: "Input is not allowed here", type: "forbidden" })
      return
  }
}

/** Turns a parse error into 422 `detail` entries rooted at `loc`. */
export const toValidationDetail = (
  error: ParseResult.ParseError,
  loc: Loc = ["body"],
): Array<ValidationDetail> => {
  const out: Array<ValidationDetail> = []
  collect(error.issue, loc, out)
  return out
}

const decodeRequest = Schema.decodeUnknownEither(ChatCompletionRequest, { errors: "all" })
const decodeRequestFirst = Schema.decodeUnknownEither(ChatCompletionRequest, { errors: "first" })
const decodeText = Schema.decodeUnknownEither(TextPart, { errors: "all" })
const decodeImage = Schema.decodeUnknownEither(ImageUrlPart, { errors: "all" })

/**
 * A body with more JSON values than this is refused before its shape is
 * checked: decoding costs time per value (a million values take seconds).
 */
export const MAX_JSON_VALUES = 100_000

/** Up to this many JSON values every shape error is reported; above, only the first (bounded work). */
export const ALL_ERRORS_MAX_VALUES = 2_000

/** The JSON values in `body` (itself, elements, property values), counted up to just past `limit`. */
const countValues = (body: unknown, limit: number): number => {
  let seen = 0
  // A stack, not recursion: a body may nest arrays 100,000 deep.
  const stack: Array<unknown> = [body]
  while (stack.length > 0) {
    const value = stack.pop()
    if (++seen > limit) return seen
    if (Array.isArray(value)) {
      if (seen + stack.length + value.length > limit) return limit + 1
      for (const element of value) stack.push(element)
    } else if (typeof value === "object" && value !== null) {
      for (const key in value) {
        if (seen + stack.length >= limit) return limit + 1
        stack.push((value as Record<string, unknown>)[key])
      }
    }
  }
  return seen
}

/** `text` / `image_url` part errors, read off the raw body so they are reported alongside any other error. */
const partDetail = (body: unknown, max: number): Array<ValidationDetail> => {
  const detail: Array<ValidationDetail> = []
  if (!Predicate.isRecord(body) || !Array.isArray(body.messages)) return detail
  body.messages.forEach((message: unknown, i: number) => {
    if (detail.length >= max || !Predicate.isRecord(message) || !Array.isArray(message.content)) return
    message.content.forEach((part: unknown, j: number) => {
      if (detail.length >= max || !Predicate.isRecord(part)) return
      const decode: ((u: unknown) => Either.Either<unknown, ParseResult.ParseError>) | undefined =
        part.type === "text" ? decodeText : part.type === "image_url" ? decodeImage : undefined
      const result = decode?.(part)
      if (result && Either.isLeft(result)) {
        detail.push(...toValidationDetail(result.left, ["body", "messages", i, "content", j]))
      }
    })
  })
  return detail
}

// --- the common request, checked by hand ---------------------------------------------

type Check = (value: unknown) => boolean

const isString: Check = (v) => typeof v === "string"
const isBoolean: Check = (v) => typeof v === "boolean"
const isNumber: Check = (v) => typeof v === "number"
const isWhole: Check = (v) => typeof v === "number" && Number.isInteger(v)
const isSafeInt: Check = (v) => typeof v === "number" && Number.isSafeInteger(v)
const isStop: Check = (v) =>
  typeof v === "string" || (Array.isArray(v) && v.length <= 64 && v.every(isString))
const isPrimitive = (v: unknown) => v === null || (typeof v !== "object" && v !== undefined)
const ROLES = new Set(["system", "user", "assistant"])

/**
 * The request's fields in the schema's order, each with the check of its
 * non-null value; `stream_options`, `response_format` and `messages` are
 * taken apart below. A field of another shape sends the body to the schema.
 */
const SCALARS: ReadonlyArray<readonly [string, Check]> = [
  ["model", isString],
  ["messages", () => false],
  ["max_completion_tokens", isWhole],
  ["max_tokens", isWhole],
  ["stream", isBoolean],
  ["stream_options", () => false],
  ["response_format", () => false],
  ["temperature", isNumber],
  ["top_p", isNumber],
  ["presence_penalty", isNumber],
  ["frequency_penalty", isNumber],
  ["seed", isSafeInt],
  ["stop", isStop],
  ["user", isString],
  ["store", isBoolean],
  ["n", isSafeInt],
]
const KNOWN = new Set(SCALARS.map(([key]) => key))
/** More messages, or more keys in one object, than this go to the schema: the work stays bounded. */
const COMMON_MAX_MESSAGES = 256
const COMMON_MAX_KEYS = 32

/** A message with text content, as the schema decodes it; `undefined` for any other shape. */
const commonMessage = (message: unknown): Record<string, unknown> | undefined => {
  if (typeof message !== "object" || message === null || Array.isArray(message)) return undefined
  const m = message as Record<string, unknown>
  if (!ROLES.has(m.role as string) || typeof m.content !== "string") return undefined
  let keys = 0
  for (const key in m) {
    if (++keys > COMMON_MAX_KEYS) return undefined
    if (key !== "role" && key !== "content" && key !== "name" && !isPrimitive(m[key])) return undefined
  }
  if (!("name" in m)) return { role: m.role, content: m.content }
  return typeof m.name === "string" ? { role: m.role, content: m.content, name: m.name } : undefined
}

/**
 * The decoded request for the shape nearly every client sends — text messages,
 * scalar options — checked by plain code, or `undefined` for anything else
 * (which the schema then decodes, with its error details). Where it answers it
 * gives exactly what the schema gives (a property test holds it to that):
 * known fields in the schema's order, unknown ones (of scalar value) dropped.
 */
export const decodeCommon = (body: unknown): ChatCompletionRequest | undefined => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) return undefined
  const b = body as Record<string, unknown>
  let keys = 0
  for (const key in b) {
    if (++keys > COMMON_MAX_KEYS || (!KNOWN.has(key) && !isPrimitive(b[key]))) return undefined
  }
  const messages = b.messages
  if (!Array.isArray(messages) || messages.length > COMMON_MAX_MESSAGES || !isString(b.model))
    return undefined
  const out: Record<string, unknown> = {}
  for (const [key, check] of SCALARS) {
    if (!(key in b)) continue
    const value = b[key]
    if (key === "messages") {
      const decoded: Array<Record<string, unknown>> = []
      for (const message of messages) {
        const m = commonMessage(message)
        if (m === undefined) return undefined
        decoded.push(m)
      }
      out.messages = decoded
    } else if (key === "stream_options") {
      if (value === null) out.stream_options = null
      else {
        if (typeof value !== "object" || Array.isArray(value)) return undefined
        const options = value as Record<string, unknown>
        let optionKeys = 0
        for (const k in options) {
          if (++optionKeys > COMMON_MAX_KEYS || (k !== "include_usage" && !isPrimitive(options[k])))
            return undefined
        }
        if (!("include_usage" in options)) out.stream_options = {}
        else if (isBoolean(options.include_usage))
          out.stream_options = { include_usage: options.include_usage }
        else return undefined
      }
    } else if (value === null) out[key] = null
    else if (check(value)) out[key] = Array.isArray(value) ? [...value] : value
    else return undefined
  }
  return out as ChatCompletionRequest
}

/**
 * Decodes a parsed JSON body. Shape errors (including those of `text` and
 * `image_url` content parts) become one `ValidationFailed` with every entry
 * (only the first for a body of more than `ALL_ERRORS_MAX_VALUES` values).
 */
export const decodeChatCompletionRequest = (
  body: unknown,
): Either.Either<ChatCompletionRequest, ValidationFailed> => {
  const common = decodeCommon(body)
  if (common !== undefined) return Either.right(common)
  const values = countValues(body, MAX_JSON_VALUES)
  if (values > MAX_JSON_VALUES) {
    return Either.left(
      new ValidationFailed({
        detail: [
          { loc: ["body"], msg: `The body holds more than ${MAX_JSON_VALUES} JSON values`, type: "too_long" },
        ],
      }),
    )
  }
  const all = values <= ALL_ERRORS_MAX_VALUES
  const decoded = all ? decodeRequest(body) : decodeRequestFirst(body)
  const detail = Either.isLeft(decoded) ? toValidationDetail(decoded.left) : []
  if (all || detail.length === 0) detail.push(...partDetail(body, all ? Number.POSITIVE_INFINITY : 1))
  if (Either.isLeft(decoded) || detail.length > 0) return Either.left(new ValidationFailed({ detail }))
  return Either.right(decoded.right)
}
