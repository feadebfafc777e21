/**
 * What a decoded request means for this service: the 400s of spec §7.2 for
 * parameters it cannot honour, content parts, ranges and limits, and the
 * normalised request handed to dispatch. Nothing here changes any state.
 */
import type { NodeImage, NodeMessage, Preset, Sampling } from "@swarmgate/dispatch"
import {
  type ChatCompletionRequest,
  InvalidRequest,
  ModelNotFound,
  RequestTooLarge,
  Tokens,
  UnsupportedContentPart,
  ZdrStorageNotSupported,
} from "@swarmgate/protocol"
import { Either } from "effect"

export interface PresetView {
  readonly preset: Preset
  readonly vision: boolean
}

export interface NormalizedRequest {
  readonly preset: Preset
  readonly model: string
  readonly messages: ReadonlyArray<NodeMessage>
  readonly stream: boolean
  readonly includeUsage: boolean
  readonly jsonMode: boolean
  readonly maxTokens: number
  readonly promptTokens: number
  readonly sampling: Sampling
}

export type PolicyError =
  | InvalidRequest
  | ModelNotFound
  | RequestTooLarge
  | UnsupportedContentPart
  | ZdrStorageNotSupported

const invalid = (param: string, message: string) => new InvalidRequest({ message, param })

const present = (body: Record<string, unknown>, name: string) =>
  body[name] !== undefined && body[name] !== null

/** OpenAI parameters this service knows and cannot honour (400, `param` = the field). */
const unsupported: ReadonlyArray<readonly [string, (v: unknown) => boolean, string]> = [
  ["tools", (v) => !Array.isArray(v) || v.length > 0, "Tool calling is not supported."],
  ["tool_choice", (v) => v !== "none", "Tool calling is not supported."],
  ["parallel_tool_calls", () => true, "Tool calling is not supported."],
  ["functions", (v) => !Array.isArray(v) || v.length > 0, "Function calling is not supported."],
  ["function_call", (v) => v !== "none", "Function calling is not supported."],
  ["logprobs", (v) => v !== false, "Log probabilities are not supported."],
  ["top_logprobs", () => true, "Log probabilities are not supported."],
  [
    "logit_bias",
    (v) => typeof v !== "object" || Object.keys(v as object).length > 0,
    "logit_bias is not supported.",
  ],
  ["audio", () => true, "Audio output is not supported."],
  [
    "modalities",
    (v) => !(Array.isArray(v) && v.length === 1 && v[0] === "text"),
    "Only the text modality is supported.",
  ],
  ["prediction", () => true, "Predicted outputs are not supported."],
  ["web_search_options", () => true, "Web search is not supported."],
]

/** The refusal of a value out of its range; undefined when it is in range (or absent). */
const outOfRange = (param: string, value: number | null | undefined, min: number, max: number) =>
  value === undefined || value === null || (value >= min && value <= max)
    ? undefined
    : invalid(param, `${param} must be between ${min} and ${max}.`)

const MAX_STOP = 4
const MAX_USER_LENGTH = 256

const parseImage = (
  url: string,
  detail: string | undefined,
  param: string,
  maxImageBytes: number,
): Either.Either<NodeImage & { readonly tokens: number }, InvalidRequest | RequestTooLarge> => {
  const tokens = detail === "low" ? Tokens.IMAGE_TOKENS_LOW : Tokens.IMAGE_TOKENS_DEFAULT
  if (url.startsWith("data:")) {
    const comma = url.indexOf(",")
    const header = comma < 0 ? "" : url.slice(5, comma)
    const mediaType = header.split(";")[0] ?? ""
    if (comma < 0 || !mediaType.startsWith("image/")) {
      return Either.left(
        invalid(`${param}.image_url.url`, "A data URL must be data:image/<type>;base64,<data>."),
      )
    }
    const data = url.length - comma - 1
    const base64 = header.endsWith(";base64")
    const padding = base64 ? (url.endsWith("==") ? 2 : url.endsWith("=") ? 1 : 0) : 0
    const bytes = base64 ? Math.floor((data * 3) / 4) - padding : data
    if (bytes > maxImageBytes) {
      return Either.left(
        new RequestTooLarge({
          message: `The image is ${bytes} bytes; the limit is ${maxImageBytes} bytes.`,
          param,
        }),
      )
    }
    return Either.right({ url, mediaType, bytes, tokens })
  }
  if (url.startsWith("https://") || url.startsWith("http://")) {
    const ext = /\.(png|jpe?g|gif|webp)(?:$|[?#])/i.exec(url)?.[1]?.toLowerCase()
    const mediaType = ext === undefined ? "image/*" : `image/${ext === "jpg" ? "jpeg" : ext}`
    return Either.right({ url, mediaType, bytes: 0, tokens })
  }
  return Either.left(invalid(`${param}.image_url.url`, "An image URL must be an http(s) or data: URL."))
}

/**
 * `countScope`: whose remembered prompt counts may be used
 * (`Tokens.promptTokens`): the account. By plain calls: an `Either` is an
 * Effect too, so a caller in `Effect.gen` yields it, and the listener's
 * plain path reads it (no generator or run-loop step per request).
 */
export const normalize = (
  request: ChatCompletionRequest,
  body: Record<string, unknown>,
  presets: (id: string) => PresetView | undefined,
  maxImageBytes: number,
  countScope = "",
): Either.Either<NormalizedRequest, PolicyError> => {
  if (request.store === true) {
    return Either.left(
      new ZdrStorageNotSupported({
        message: "store: true is not supported: this service stores no completions.",
        param: "store",
      }),
    )
  }
  const view = presets(request.model)
  if (view === undefined) return Either.left(ModelNotFound.forModel(request.model))
  const { preset } = view

  for (const [name, refused, why] of unsupported) {
    if (present(body, name) && refused(body[name])) return Either.left(invalid(name, why))
  }
  if (request.n !== undefined && request.n !== null && request.n !== 1) {
    return Either.left(invalid("n", "Only n = 1 is supported."))
  }
  const stream = request.stream === true
  if (!stream && request.stream_options !== undefined && request.stream_options !== null) {
    return Either.left(invalid("stream_options", "stream_options is only allowed when stream is true."))
  }

  const format = request.response_format?.type
  if (format !== undefined && format !== "text" && format !== "json_object") {
    return Either.left(
      invalid(
        "response_format",
        format === "json_schema"
          ? "response_format json_schema is not supported; use json_object."
          : "response_format.type must be text or json_object.",
      ),
    )
  }

  const range =
    outOfRange("temperature", request.temperature, 0, 2) ??
    outOfRange("top_p", request.top_p, 0, 1) ??
    outOfRange("presence_penalty", request.presence_penalty, -2, 2) ??
    outOfRange("frequency_penalty", request.frequency_penalty, -2, 2)
  if (range !== undefined) return Either.left(range)
  const stop = typeof request.stop === "string" ? [request.stop] : (request.stop ?? undefined)
  if (stop !== undefined) {
    if (stop.length > MAX_STOP)
      return Either.left(invalid("stop", `At most ${MAX_STOP} stop sequences are allowed.`))
    if (stop.some((s) => s.length === 0))
      return Either.left(invalid("stop", "Stop sequences must not be empty."))
  }
  if (request.user !== undefined && request.user !== null && request.user.length > MAX_USER_LENGTH) {
    return Either.left(invalid("user", `user must be at most ${MAX_USER_LENGTH} characters.`))
  }

  for (const name of ["max_tokens", "max_completion_tokens"] as const) {
    const value = request[name]
    if (value !== undefined && value !== null && value < 1)
      return Either.left(invalid(name, `${name} must be at least 1.`))
  }

  if (request.messages.length === 0) return Either.left(invalid("messages", "messages must not be empty."))
  const messages: Array<NodeMessage & Tokens.CountableMessage> = []
  for (const [i, message] of request.messages.entries()) {
    if (typeof message.content === "string") {
      messages.push({
        role: message.role,
        content: message.content,
        name: message.name,
        images: [],
        imageTokens: 0,
      })
      continue
    }
    const texts: Array<string> = []
    const images: Array<NodeImage> = []
    let imageTokens = 0
    for (const [j, part] of message.content.entries()) {
      const param = `messages[${i}].content[${j}]`
      switch (part.type) {
        case "text":
          texts.push(part.text as string)
          break
        case "image_url": {
          const { url, detail } = part.image_url as { url: string; detail?: string }
          if (!view.vision) {
            return Either.left(invalid(param, `The model ${preset.id} does not accept images.`))
          }
          const parsed = parseImage(url, detail, param, maxImageBytes)
          if (Either.isLeft(parsed)) return Either.left(parsed.left)
          const image = parsed.right
          images.push({ url: image.url, mediaType: image.mediaType, bytes: image.bytes })
          imageTokens += image.tokens
          break
        }
        case "input_audio":
        case "file":
          return Either.left(
            new UnsupportedContentPart({
              message: `Content parts of type ${part.type} are not accepted.`,
              param,
            }),
          )
        default:
          return Either.left(
            invalid(`${param}.type`, `Unknown content part type ${String(part.type).slice(0, 50)}.`),
          )
      }
    }
    messages.push({
      role: message.role,
      content: texts.join("\n"),
      name: message.name,
      images,
      imageTokens,
    })
  }

  // Counting stops past the context: a huge prompt costs no more than one that fits.
  const promptTokens = Tokens.promptTokens(messages, preset.maxContextTokens - 1, countScope)
  if (promptTokens >= preset.maxContextTokens) {
    return Either.left(
      invalid(
        "messages",
        `The prompt is longer than the ${preset.maxContextTokens - 1} tokens ${preset.id} accepts.`,
      ),
    )
  }
  // The smaller cap wins; caps above what the preset can produce are clamped (README: token caps).
  const caps = [request.max_tokens, request.max_completion_tokens].filter(
    (v): v is number => typeof v === "number",
  )
  const maxTokens = Math.min(
    caps.length > 0 ? Math.min(...caps) : preset.maxOutputTokens,
    preset.maxOutputTokens,
    preset.maxContextTokens - promptTokens,
  )

  return Either.right({
    preset,
    model: request.model,
    messages: messages.map(({ role, content, images }) => ({ role, content, images })),
    stream,
    includeUsage: stream && request.stream_options?.include_usage === true,
    jsonMode: format === "json_object",
    maxTokens,
    promptTokens,
    sampling: {
      temperature: request.temperature ?? undefined,
      topP: request.top_p ?? undefined,
      seed: request.seed ?? undefined,
      stop,
      presencePenalty: request.presence_penalty ?? undefined,
      frequencyPenalty: request.frequency_penalty ?? undefined,
      user: request.user ?? undefined,
    },
  })
}
