/**
 * Wire shapes of spec §2 as Effect Schemas. Requests accept additional
 * properties (they are ignored unless the gateway's policy names them).
 */
import { Schema } from "effect"

export const Role = Schema.Literal("system", "user", "assistant")
export type Role = typeof Role.Type

export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
export type TextPart = typeof TextPart.Type

export const ImageUrlPart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({
    url: Schema.String,
    detail: Schema.optional(Schema.Literal("auto", "low", "high")),
  }),
})
export type ImageUrlPart = typeof ImageUrlPart.Type

/**
 * Any part by its `type`. The precise shape of `text` and `image_url` parts is
 * checked by `TextPart` / `ImageUrlPart`; other types are refused by policy
 * (audio and file with `unsupported_content_type`).
 */
export const ContentPart = Schema.Struct(
  { type: Schema.String },
  Schema.Record({ key: Schema.String, value: Schema.Unknown }),
)
export type ContentPart = typeof ContentPart.Type

export const MessageContent = Schema.Union(Schema.String, Schema.Array(ContentPart))
export type MessageContent = typeof MessageContent.Type

export const Message = Schema.Struct({
  role: Role,
  content: MessageContent,
  name: Schema.optional(Schema.String),
})
export type Message = typeof Message.Type

const optionalNullable = <S extends Schema.Schema.Any>(schema: S) => Schema.optional(Schema.NullOr(schema))

export const StreamOptions = Schema.Struct({ include_usage: Schema.optional(Schema.Boolean) })

export const ResponseFormat = Schema.Struct(
  { type: Schema.String },
  Schema.Record({ key: Schema.String, value: Schema.Unknown }),
)
export type ResponseFormat = typeof ResponseFormat.Type

export const Stop = Schema.Union(Schema.String, Schema.Array(Schema.String))

/**
 * A token cap: any whole number. `Schema.Int` would refuse integers beyond
 * 2^53 as "not an integer"; a cap that large is an integer all the same, and
 * is clamped to what the preset can produce like any other (README).
 */
const TokenCap = Schema.Number.pipe(
  Schema.filter((n) => Number.isInteger(n), { message: () => "Expected an integer" }),
)

export const ChatCompletionRequest = Schema.Struct({
  model: Schema.String,
  messages: Schema.Array(Message),
  max_completion_tokens: optionalNullable(TokenCap),
  max_tokens: optionalNullable(TokenCap),
  stream: optionalNullable(Schema.Boolean),
  stream_options: optionalNullable(StreamOptions),
  response_format: optionalNullable(ResponseFormat),
  temperature: optionalNullable(Schema.Number),
  top_p: optionalNullable(Schema.Number),
  presence_penalty: optionalNullable(Schema.Number),
  frequency_penalty: optionalNullable(Schema.Number),
  seed: optionalNullable(Schema.Int),
  stop: optionalNullable(Stop),
  user: optionalNullable(Schema.String),
  store: optionalNullable(Schema.Boolean),
  n: optionalNullable(Schema.Int),
})
export type ChatCompletionRequest = typeof ChatCompletionRequest.Type

export const FinishReason = Schema.Literal("stop", "length", "content_filter")
export type FinishReason = typeof FinishReason.Type

export const Usage = Schema.Struct({
  prompt_tokens: Schema.Int,
  completion_tokens: Schema.Int,
  total_tokens: Schema.Int,
})
export type Usage = typeof Usage.Type

export const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      message: Schema.Struct({ role: Schema.Literal("assistant"), content: Schema.String }),
      finish_reason: FinishReason,
    }),
  ),
  usage: Usage,
})
export type ChatCompletion = typeof ChatCompletion.Type

export const ChatCompletionChunk = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion.chunk"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(
    Schema.Struct({
      index: Schema.Int,
      delta: Schema.Struct({
        role: Schema.optional(Schema.Literal("assistant")),
        content: Schema.optional(Schema.String),
      }),
      finish_reason: Schema.NullOr(FinishReason),
    }),
  ),
  /** Present (null) on every chunk when usage was asked for; set on the last one. */
  usage: Schema.optional(Schema.NullOr(Usage)),
})
export type ChatCompletionChunk = typeof ChatCompletionChunk.Type

/** Our answer to "field for model permissions and capabilities: not shown" (spec §2.1). */
export const ModelCapabilities = Schema.Struct({
  streaming: Schema.Boolean,
  json_mode: Schema.Boolean,
  vision: Schema.Boolean,
  max_context_tokens: Schema.Int,
  max_output_tokens: Schema.Int,
})
export type ModelCapabilities = typeof ModelCapabilities.Type

export const Model = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model"),
  created: Schema.Int,
  owned_by: Schema.String,
  capabilities: ModelCapabilities,
})
export type Model = typeof Model.Type

export const ModelList = Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(Model) })
export type ModelList = typeof ModelList.Type

export const ErrorEnvelopeSchema = Schema.Struct({
  error: Schema.Struct({
    message: Schema.String,
    type: Schema.String,
    code: Schema.String,
    param: Schema.NullOr(Schema.String),
  }),
  request_id: Schema.String,
})
