/**
 * The floor of the benchmark: an OpenAI-compatible node on bare node:http
 * that answers at once. `stream: false` → one chat.completion body;
 * `stream: true` → SSE with a role chunk, N one-token content chunks, the
 * finish chunk, the usage chunk (when asked) and [DONE] — all in one write,
 * or one content chunk every `--interval-ms` (a paced node, for long-lived
 * streams). N is `chunks=N` in the last message (default `--chunks`),
 * capped by `max_tokens`, so the same node serves 20- and 200-chunk
 * streams behind a gateway that forwards the prompt unchanged.
 *
 *   node --import tsx bench/instant-node.ts --port 0 [--chunks 20] [--interval-ms 0]
 */
import { createServer, type IncomingMessage, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { parseArgs } from "node:util"

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    chunks: { type: "string", default: "20" },
    "interval-ms": { type: "string", default: "0" },
  },
})
const defaultChunks = Number(values.chunks)
const intervalMillis = Number(values["interval-ms"])
// " the" is one token for o200k_base, so the gateway's count equals the chunk count.
const TOKEN = " the"

interface Body {
  readonly model?: string
  readonly stream?: boolean
  readonly max_tokens?: number
  readonly max_completion_tokens?: number
  readonly stream_options?: { readonly include_usage?: boolean }
  readonly messages?: ReadonlyArray<{ readonly content?: unknown }>
}

let sequence = 0

const chunksOf = (body: Body): number => {
  const last = body.messages?.[body.messages.length - 1]?.content
  const asked = typeof last === "string" ? /chunks=(\d+)/.exec(last) : null
  const cap = body.max_completion_tokens ?? body.max_tokens ?? Number.POSITIVE_INFINITY
  return Math.min(asked === null ? defaultChunks : Number(asked[1]), cap)
}

const answer = (res: ServerResponse, body: Body) => {
  const n = chunksOf(body)
  const id = `chatcmpl-instant${++sequence}`
  const created = Math.floor(Date.now() / 1000)
  const model = body.model ?? "instant"
  const usage = { prompt_tokens: 10, completion_tokens: n, total_tokens: 10 + n }
  if (body.stream !== true) {
    const text = JSON.stringify({
      id,
      object: "chat.completion",
      created,
      model,
      choices: [
        { index: 0, message: { role: "assistant", content: TOKEN.repeat(n) }, finish_reason: "stop" },
      ],
      usage,
    })
    res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
    res.end(text)
    return
  }
  const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[{"index":0,"delta":`
  const event = (delta: string, finish: string | null) =>
    `data: ${head}${delta},"finish_reason":${finish === null ? "null" : `"${finish}"`}}]}\n\n`
  const content = event(`{"content":"${TOKEN}"}`, null)
  const tail =
    event("{}", "stop") +
    (body.stream_options?.include_usage === true
      ? `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":[],"usage":${JSON.stringify(usage)}}\n\n`
      : "") +
    "data: [DONE]\n\n"
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" })
  const first = event('{"role":"assistant","content":""}', null)
  if (intervalMillis <= 0) {
    res.end(first + content.repeat(n) + tail)
    return
  }
  res.write(first + (n > 0 ? content : ""))
  let sent = Math.min(1, n)
  if (sent >= n) {
    res.end(tail)
    return
  }
  const timer = setInterval(() => {
    sent++
    if (sent < n) res.write(content)
    else {
      clearInterval(timer)
      res.end(content + tail)
    }
  }, intervalMillis)
  res.once("close", () => clearInterval(timer))
}

const readJson = (req: IncomingMessage, done: (body: Body | undefined) => void) => {
  const chunks: Array<Buffer> = []
  req.on("data", (chunk: Buffer) => chunks.push(chunk))
  req.once("end", () => {
    try {
      done(JSON.parse(Buffer.concat(chunks).toString("utf8")) as Body)
    } catch {
      done(undefined)
    }
  })
}

const server = createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const path = (req.url ?? "/").split("?")[0]!
  if (req.method === "POST" && path.endsWith("/v1/chat/completions"))
    return readJson(req, (body) => {
      if (body === undefined) {
        res.writeHead(400, { "content-type": "application/json" })
        res.end('{"error":{"message":"bad JSON","type":"invalid_request_error","code":"invalid_json"}}')
      } else answer(res, body)
    })
  if (path.endsWith("/v1/models")) {
    res.writeHead(200, { "content-type": "application/json" })
    return res.end(
      '{"object":"list","data":[{"id":"instant","object":"model","created":0,"owned_by":"bench"}]}',
    )
  }
  res.writeHead(path.endsWith("/healthz") ? 200 : 404, { "content-type": "application/json" })
  res.end('{"status":"ok"}')
})
server.listen(Number(values.port), "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo
  console.log(JSON.stringify({ event: "listening", host: "127.0.0.1", port }))
})
process.once("SIGTERM", () => process.exit(0))
