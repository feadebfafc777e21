/**
 * The request path's shared timers: running-time deadlines and SSE
 * keep-alives cost one list entry per request, not a timer each. Deadlines
 * of one duration come nearly in the order they fall due, so each duration
 * keeps a list sorted from the tail with one Node timer armed for its head;
 * keep-alives share one interval, stopped once it finds no stream open.
 */
import { LinkedSet } from "@swarmgate/protocol"

interface Deadline {
  readonly at: number
  /** Dropped on cancel: a finished request's closure (its fiber, response, buffers) must not wait for the deadline. */
  fire: (() => void) | undefined
}

class Lane {
  private queue: Array<Deadline> = []
  private head = 0
  private cancelled = 0
  private timer: ReturnType<typeof setTimeout> | undefined
  /** When the armed timer is due. */
  private armedAt = 0
  /** Firing what fell due: that run arms the timer for the head it leaves, once. */
  private expiring = false

  add(deadline: Deadline) {
    // Deadlines come nearly in order: an out-of-order one is placed from the tail back, not appended late.
    let at = this.queue.length
    while (at > this.head && this.queue[at - 1]!.at > deadline.at) at--
    if (at === this.queue.length) this.queue.push(deadline)
    else this.queue.splice(at, 0, deadline)
    // A deadline set by one that fires (an idle check re-armed) is armed for by `expire` itself:
    // arming here too would leave a second timer running.
    if (this.expiring) return
    if (this.timer === undefined) this.arm(Date.now())
    else if (at === this.head && deadline.at < this.armedAt) {
      // A new head, due sooner than the armed timer. (One due later waits for it: a lane emptied by
      // cancels keeps its timer, which then re-arms for what came since — not a timer per request.)
      clearTimeout(this.timer)
      this.arm(Date.now())
    }
  }

  /** Entries held: live ones, cancelled ones not yet shed, and fired or skipped ones ahead of the head. */
  get size(): number {
    return this.queue.length
  }

  /**
   * Most deadlines are cancelled long before they fall due: those at either
   * end of the lane leave at once, the others once they are the majority.
   */
  cancel(deadline: Deadline) {
    if (deadline.fire === undefined) return
    deadline.fire = undefined
    this.cancelled++
    // Requests end in about the order they began, and at one connection the only deadline is the
    // last: cancelled entries at either end leave at once instead of waiting for a compaction (kept
    // until then, they outlived young collections).
    const queue = this.queue
    while (queue.length > this.head && queue[queue.length - 1]!.fire === undefined) {
      queue.pop()
      this.cancelled--
    }
    while (this.head < queue.length && queue[this.head]!.fire === undefined) {
      this.head++
      this.cancelled--
    }
    if (this.head === queue.length) {
      queue.length = 0
      this.head = 0
      return
    }
    if (this.head > 64 && this.head * 2 > queue.length) {
      queue.splice(0, this.head)
      this.head = 0
    }
    if (this.cancelled > 1024 && this.cancelled * 2 > this.queue.length - this.head) {
      this.queue = this.queue.slice(this.head).filter((d) => d.fire !== undefined)
      this.head = 0
      this.cancelled = 0
    }
  }

  private arm(now: number) {
    while (this.head < this.queue.length && this.queue[this.head]!.fire === undefined) {
      this.head++
      this.cancelled = Math.max(0, this.cancelled - 1)
    }
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
    this.armedAt = this.queue[this.head]!.at
    this.timer = setTimeout(() => this.expire(), Math.max(0, this.armedAt - now))
    this.timer.unref()
  }

  private expire() {
    const now = Date.now()
    this.expiring = true
    try {
      while (this.head < this.queue.length && this.queue[this.head]!.at <= now) {
        const deadline = this.queue[this.head++]!
        const fire = deadline.fire
        if (fire === undefined) this.cancelled = Math.max(0, this.cancelled - 1)
        else {
          deadline.fire = undefined
          fire()
        }
      }
    } finally {
      this.expiring = false
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
  const entry: Deadline = { at: from + millis, fire }
  const owner = lane
  owner.add(entry)
  return () => owner.cancel(entry)
}

/** Entries the lane of `millis` holds (what it keeps alive; `Lane.size`), for tests. */
export const held = (millis: number): number => lanes.get(millis)?.size ?? 0

/** An open stream that wants a comment after `intervalMillis` without data. */
export interface KeepAliveStream {
  lastWrite: number
  readonly intervalMillis: number
  /** Writes the keep-alive comment. */
  readonly ping: () => void
}

// A linked set: one stream added and removed per SSE answer (protocol/LinkedSet.ts says why not a Set).
const streams = new LinkedSet<KeepAliveStream>()
let ticker: ReturnType<typeof setInterval> | undefined
let tickMillis = 0
/** Ticks in a row that found no stream open. */
let idleTicks = 0

const stopTicker = () => {
  if (ticker !== undefined) clearInterval(ticker)
  ticker = undefined
}

const tick = () => {
  // Stopped only after a whole tick without streams: with one short stream at a time (an SSE
  // answer of a few milliseconds), stopping at each last removal made an interval per request.
  if (streams.size === 0) {
    if (++idleTicks >= 2) stopTicker()
    return
  }
  idleTicks = 0
  const now = Date.now()
  streams.forEach((stream) => {
    if (now - stream.lastWrite >= stream.intervalMillis) {
      stream.lastWrite = now
      stream.ping()
    }
  })
}

/** Keeps `stream` alive until the returned removal is called. */
export const keepAlive = (stream: KeepAliveStream): (() => void) => {
  const link = streams.add(stream)
  const wanted = Math.max(10, Math.floor(stream.intervalMillis / 2))
  idleTicks = 0
  if (ticker === undefined || wanted < tickMillis) {
    stopTicker()
    tickMillis = wanted
    ticker = setInterval(tick, tickMillis)
    ticker.unref()
  }
  return () => streams.remove(link)
}
