/**
 * One chat completion as the client sees it: the status, the body (one JSON
 * document or SSE events), when each token arrived, and what went wrong.
 * SSE events are scanned, not parsed: only an event that carries an error or
 * the usage is handed to JSON.parse, so that the generator stays cheap when a
 * stream has hundreds of chunks.
 */
import { StringDecoder } from "node:string_decoder"

export interface Outcome {
  readonly ok: boolean
  /** 0 when no response arrived. */
  readonly status: number
  /** `error.code` of the answer or of the stream's error event, or a client-side code; undefined when ok. */
  readonly code: string | undefined
  /** When the request was due (open loop) or sent (closed loop), performance.now() milliseconds. */
  readonly startMillis: number
  readonly firstTokenMillis: number | undefined
  readonly endMillis: number
  /** `usage.completion_tokens` when the server sent it, else the content chunks. */
  readonly outputTokens: number
  readonly contentChunks: number
}

/** Called for each content-bearing SSE event; `gapMillis` is the time since the previous one. */
export type OnToken = (now: number, gapMillis: number | undefined) => void

const MAX_JSON_BODY = 1 << 20

interface ErrorBody {
  readonly error?: { readonly code?: unknown; readonly type?: unknown } | string
}

const codeOf = (text: string): string | undefined => {
  try {
    const error = (JSON.parse(text) as ErrorBody).error
    if (typeof error === "string") return error.length > 0 ? error : undefined
    if (error === undefined || error === null) return undefined
    if (typeof error.code === "string" && error.code.length > 0) return error.code
    if (typeof error.type === "string" && error.type.length > 0) return error.type
    return "error"
  } catch {
    return undefined
  }
}

/** True when the event's `delta.content` (or `message.content`) is a non-empty string. */
export const hasContent = (data: string): boolean => {
  let at = data.indexOf('"content":')
  while (at >= 0) {
    let i = at + 10
    while (data.charCodeAt(i) === 32) i++
    if (data.charCodeAt(i) === 34 && data.charCodeAt(i + 1) !== 34) return true
    at = data.indexOf('"content":', at + 10)
  }
  return false
}

const completionTokensOf = (text: string): number | undefined => {
  try {
    const usage = (JSON.parse(text) as { usage?: { completion_tokens?: unknown } | null }).usage
    return typeof usage?.completion_tokens === "number" ? usage.completion_tokens : undefined
  } catch {
    return undefined
  }
}

export class Exchange {
  status = 0
  private sse = false
  private readonly decoder = new StringDecoder("utf8")
  private pending = ""
  private body = ""
  private done = false
  private streamError: string | undefined
  private usageTokens: number | undefined
  private chunks = 0
  private firstToken: number | undefined
  private lastToken: number | undefined

  constructor(
    readonly startMillis: number,
    private readonly onToken: OnToken,
  ) {}

  /** A content token arrived and the response has not been finished or failed yet. */
  get streaming(): boolean {
    return this.firstToken !== undefined
  }

  response(status: number, contentType: string): void {
    this.status = status
    this.sse = status >= 200 && status < 300 && contentType.startsWith("text/event-stream")
  }

  data(chunk: Buffer, now: number): void {
    if (!this.sse) {
      if (this.body.length < MAX_JSON_BODY) this.body += this.decoder.write(chunk)
      return
    }
    let text = this.pending + this.decoder.write(chunk)
    if (text.includes("\r")) text = text.replace(/\r\n?/g, "\n")
    let from = 0
    for (let end = text.indexOf("\n\n"); end >= 0; end = text.indexOf("\n\n", from)) {
      this.event(text.slice(from, end), now)
      from = end + 2
    }
    this.pending = from === 0 ? text : text.slice(from)
  }

  private event(block: string, now: number): void {
    let data: string
    if (block.startsWith("data: ") && !block.includes("\n")) data = block.slice(6)
    else {
      const lines: Array<string> = []
      for (const line of block.split("\n"))
        if (line.startsWith("data:")) lines.push(line.slice(line.charCodeAt(5) === 32 ? 6 : 5))
      if (lines.length === 0) return // a comment such as `: keep-alive`
      data = lines.join("\n")
    }
    if (this.done || this.streamError !== undefined) return
    if (data === "[DONE]") {
      this.done = true
      return
    }
    if (data.includes('"error"')) {
      const code = codeOf(data)
      if (code !== undefined) {
        this.streamError = code === "error" ? "stream_error" : code
        return
      }
    }
    if (hasContent(data)) {
      this.chunks++
      this.onToken(now, this.lastToken === undefined ? undefined : now - this.lastToken)
      if (this.firstToken === undefined) this.firstToken = now
      this.lastToken = now
    }
    if (data.includes('"usage":{')) {
      const tokens = completionTokensOf(data)
      if (tokens !== undefined) this.usageTokens = tokens
    }
  }

  /** The response ended (`now`); what it amounts to. */
  finish(now: number): Outcome {
    const base = {
      status: this.status,
      startMillis: this.startMillis,
      endMillis: now,
      contentChunks: this.chunks,
    }
    if (this.status < 200 || this.status >= 300) {
      this.body += this.decoder.end()
      return {
        ...base,
        ok: false,
        code: codeOf(this.body) ?? `http_${this.status}`,
        firstTokenMillis: undefined,
        outputTokens: 0,
      }
    }
    if (!this.sse) {
      this.body += this.decoder.end()
      const tokens = completionTokensOf(this.body)
      const valid = tokens !== undefined || codeOf(this.body) === undefined
      return {
        ...base,
        ok: valid,
        code: valid ? undefined : (codeOf(this.body) ?? "bad_body"),
        // Non-streamed: the first token is the whole answer (as vLLM's benchmark counts it).
        firstTokenMillis: valid ? now : undefined,
        outputTokens: tokens ?? 0,
      }
    }
    const tail = this.pending + this.decoder.end()
    if (tail.trim().length > 0) this.event(tail.trim(), now)
    const code = this.streamError ?? (this.done ? undefined : "truncated")
    return {
      ...base,
      ok: code === undefined,
      code,
      firstTokenMillis: this.firstToken,
      outputTokens: this.usageTokens ?? this.chunks,
    }
  }

  /** The connection failed (`error`) at `now`; `code` overrides what the error says. */
  fail(error: unknown, now: number, code?: string): Outcome {
    return {
      ok: false,
      status: this.status,
      code: code ?? (this.status === 0 ? networkCode(error) : "stream_broken"),
      startMillis: this.startMillis,
      firstTokenMillis: this.firstToken,
      endMillis: now,
      outputTokens: this.usageTokens ?? this.chunks,
      contentChunks: this.chunks,
    }
  }
}

/** Both clients' socket errors under one name, so that their error mixes compare. */
export const networkCode = (error: unknown): string => {
  const e = error as { code?: string; name?: string; message?: string; cause?: { code?: string } }
  const code = e?.code ?? e?.cause?.code ?? ""
  if (e?.name === "TimeoutError" || code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT")
    return "client_timeout"
  if (code === "ECONNREFUSED") return "connection_refused"
  if (
    code === "ECONNRESET" ||
    code === "EPIPE" ||
    code === "UND_ERR_SOCKET" ||
    code === "UND_ERR_CLOSED" ||
    e?.message === "socket hang up"
  )
    return "connection_reset"
  return "connection_error"
}
