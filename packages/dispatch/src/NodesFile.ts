/**
 * How an operator describes an HTTP node: in the nodes file
 * (`SWARMGATE_NODES_FILE`, a JSON list) and in `POST /admin/v1/nodes`.
 */
import { readFileSync } from "node:fs"
import { Either, ParseResult, Schema } from "effect"

const NodeId = Schema.String.pipe(
  Schema.pattern(/^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/, {
    message: () => "an id of letters, digits and . _ : - (at most 128 characters)",
  }),
)

const HttpUrl = Schema.String.pipe(
  Schema.filter(
    (value) => {
      try {
        const url = new URL(value)
        return (url.protocol === "http:" || url.protocol === "https:") && url.search === "" && url.hash === ""
      } catch {
        return false
      }
    },
    { message: () => "an http(s) URL without query or fragment, e.g. http://10.0.0.5:8000" },
  ),
)

export const NodeSpec = Schema.Struct({
  id: NodeId,
  /** Base URL: requests go to `{url}/v1/chat/completions`. */
  url: HttpUrl,
  /** Preset id → the node's own model name for it. */
  models: Schema.Record({ key: Schema.String, value: Schema.String.pipe(Schema.minLength(1)) }).pipe(
    Schema.filter((models) => Object.keys(models).length > 0, { message: () => "at least one preset" }),
  ),
  capacity: Schema.Int.pipe(Schema.between(1, 100_000)),
  vision: Schema.optional(Schema.Boolean),
  /** Sent as `Authorization: Bearer …` to servers that want a key. */
  api_key: Schema.optional(Schema.String),
})
export type NodeSpec = typeof NodeSpec.Type

export const NodesFile = Schema.Array(NodeSpec)

export const decodeNodeSpec = (input: unknown): Either.Either<NodeSpec, string> =>
  Either.mapLeft(Schema.decodeUnknownEither(NodeSpec)(input), (e) =>
    ParseResult.TreeFormatter.formatErrorSync(e),
  )

/** Parses the nodes file's text; refuses malformed entries and repeated ids. */
export const parseNodesFile = (text: string): Either.Either<ReadonlyArray<NodeSpec>, string> => {
  let json: unknown
  try {
    json = JSON.parse(text)
  } catch (e) {
    return Either.left(`not JSON: ${(e as Error).message}`)
  }
  const decoded = Schema.decodeUnknownEither(NodesFile)(json)
  if (Either.isLeft(decoded)) return Either.left(ParseResult.TreeFormatter.formatErrorSync(decoded.left))
  const seen = new Set<string>()
  for (const spec of decoded.right) {
    if (seen.has(spec.id)) return Either.left(`node id ${spec.id} appears twice`)
    seen.add(spec.id)
  }
  return Either.right(decoded.right)
}

export const readNodesFile = (path: string): Either.Either<ReadonlyArray<NodeSpec>, string> => {
  let text: string
  try {
    text = readFileSync(path, "utf8")
  } catch (e) {
    return Either.left(`cannot read ${path}: ${(e as Error).message}`)
  }
  return Either.mapLeft(parseNodesFile(text), (message) => `${path}: ${message}`)
}
