/**
 * The request path's shared timers: running-time deadlines and SSE
 * keep-alives cost one list entry per request, not a timer each. Deadlines
 * of one duration expire in the order they were set, so each duration keeps
 * a FIFO with one Node timer armed for its head; keep-alives share one
 * interval that runs only while streams are open.
 */

interface Deadline {
  readonly at: number
  readonly fire: () => void
  cancelled: boolean
}

class Lane {
  private readonly queue: Array<Deadline> = []
  private head = 0
  private timer: ReturnType<typeof setTimeout> | undefined

  add(deadline: Deadline) {
    this.queue.push(deadline)
    if (this.timer === undefined) this.arm(Date.now())
  }

  private arm(now: number) {
    while (this.head < this.queue.length && this.queue[this.head]!.cancelled) this.head++
    if (this.head >= this.queue.length) {
      this.queue.length = 0
      this.head = 0
      this.timer = undefined
      return
    }
    // Compact now and then: cancelled entries ahead of the head are gone for good.
    if (this.head > 1024 && this.head * 2 > this.queue.length) {
      this.queue.splice(0, this.head)
      this.head = 0
    }
    this.timer = setTimeout(() => this.expire(), Math.max(0, this.queue[this.head]!.at - now))
    this.timer.unref()
  }

  private expire() {
    const now = Date.now()
    while (this.head < this.queue.length && this.queue[this.head]!.at <= now) {
      const deadline = this.queue[this.head++]!
      if (!deadline.cancelled) {
        deadline.cancelled = true
        deadline.fire()
      }
    }
    this.arm(now)
  }
}

const lanes = new Map<number, Lane>()

/**
 * Calls `fire` once `millis` have passed since `from` (default now), unless
 * the returned cancel came first. Deadlines of one `millis` share a list: give
 * `from` in the order the deadlines are set (a request's arrival time is).
 */
export const deadline = (millis: number, fire: () => void, from: number = Date.now()): (() => void) => {
  let lane = lanes.get(millis)
  if (lane === undefined) {
    lane = new Lane()
    lanes.set(millis, lane)
  }
  const entry: Deadline = { at: from + millis, fire, cancelled: false }
  lane.add(entry)
  return () => {
    entry.cancelled = true
  }
}

/** An open stream that wants a comment after `intervalMillis` without data. */
export interface KeepAliveStream {
  lastWrite: number
  readonly intervalMillis: number
  /** Writes the keep-alive comment. */
  readonly ping: () => void
}

const streams = new Set<KeepAliveStream>()
let ticker: ReturnType<typeof setInterval> | undefined
let tickMillis = 0

const tick = () => {
  const now = Date.now()
  for (const stream of streams) {
    if (now - stream.lastWrite >= stream.intervalMillis) {
      stream.lastWrite = now
      stream.ping()
    }
  }
}

/** Keeps `stream` alive until the returned removal is called. */
export const keepAlive = (stream: KeepAliveStream): (() => void) => {
  streams.add(stream)
  const wanted = Math.max(10, Math.floor(stream.intervalMillis / 2))
  if (ticker === undefined || wanted < tickMillis) {
    if (ticker !== undefined) clearInterval(ticker)
    tickMillis = wanted
    ticker = setInterval(tick, tickMillis)
    ticker.unref()
  }
  return () => {
    streams.delete(stream)
    if (streams.size === 0 && ticker !== undefined) {
      clearInterval(ticker)
      ticker = undefined
    }
  }
}
