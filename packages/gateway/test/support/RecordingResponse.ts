/** What an answer calls on a `ServerResponse`, recorded; `onHead` runs (queued) once the head is written. */
import { EventEmitter } from "node:events"

export class RecordingResponse extends EventEmitter {
  status: number | undefined
  headers: Record<string, string> = {}
  body = ""
  writableEnded = false
  destroyed = false
  headersSent = false
  constructor(private readonly onHead?: () => void) {
    super()
  }
  writeHead(status: number, headers: Record<string, string> = {}) {
    this.status = status
    this.headers = { ...headers }
    this.headersSent = true
    if (this.onHead !== undefined) queueMicrotask(this.onHead)
    return this
  }
  write(data: string) {
    this.body += data
    return true
  }
  end(data?: string) {
    this.body += data ?? ""
    this.writableEnded = true
    return this
  }
}
