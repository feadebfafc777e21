/**
 * The shared deadline lists and keep-alive interval: what fires fires once and
 * in order, what is cancelled never fires, and cancelled deadlines are shed.
 */
import { describe, expect, it, vi } from "@effect/vitest"
import * as Timers from "../src/Timers"

const sleep = (millis: number) => new Promise((resolve) => setTimeout(resolve, millis))
/** Waits until `done` holds, or 5 s: what must happen does, however busy the machine. */
const until = async (done: () => boolean) => {
  for (const end = Date.now() + 5_000; !done() && Date.now() < end; ) await sleep(5)
}

describe("Timers", () => {
  it("deadlines of one duration fire once each, in order; cancelled ones never", async () => {
    const fired: Array<number> = []
    const cancels: Array<() => void> = []
    for (let i = 0; i < 10; i++) cancels.push(Timers.deadline(30, () => fired.push(i)))
    cancels[3]!()
    cancels[7]!()
    await sleep(80)
    expect(fired).toEqual([0, 1, 2, 4, 5, 6, 8, 9])
    // A cancel after firing is harmless.
    for (const cancel of cancels) cancel()
    await sleep(10)
    expect(fired).toHaveLength(8)
  })

  it("counts from the given start: an earlier start falls due first", async () => {
    const fired: Array<string> = []
    const now = Date.now()
    Timers.deadline(60, () => fired.push("arrived now"), now)
    Timers.deadline(60, () => fired.push("arrived 40 ms ago"), now - 40)
    await sleep(120)
    expect(fired).toEqual(["arrived 40 ms ago", "arrived now"])
  })

  it("10,000 cancelled deadlines are shed and the lane still fires what is due", async () => {
    let called = 0
    for (let i = 0; i < 10_000; i++) Timers.deadline(600_000, () => called++)()
    let fired = false
    Timers.deadline(
      600_000,
      () => {
        fired = true
      },
      Date.now() - 600_000,
    )
    await sleep(30)
    expect(fired).toBe(true)
    expect(called).toBe(0)
  })

  it("a deadline cancelled at either end of its lane is shed at once; one between live ones waits", () => {
    const millis = 987_654
    const first = Timers.deadline(millis, () => {})
    const middle = Timers.deadline(millis, () => {})
    const last = Timers.deadline(millis, () => {})
    expect(Timers.held(millis)).toBe(3)
    middle()
    expect(Timers.held(millis)).toBe(3)
    last()
    // The last, then the middle one it uncovered.
    expect(Timers.held(millis)).toBe(1)
    first()
    expect(Timers.held(millis)).toBe(0)
    // Requests end in about the order they began: cancelled from the front, nothing is kept.
    const cancels = Array.from({ length: 2_000 }, () => Timers.deadline(millis, () => {}))
    for (const [i, cancel] of cancels.entries()) {
      cancel()
      // What is held ahead of the live ones never outgrows them (and a small slack).
      expect(Timers.held(millis)).toBeLessThanOrEqual(2 * (cancels.length - i - 1) + 65)
    }
    expect(Timers.held(millis)).toBe(0)
    // One request at a time (set, then cancelled): the lane keeps one timer, not one per request.
    const timeouts = vi.spyOn(globalThis, "setTimeout")
    try {
      for (let i = 0; i < 100; i++) Timers.deadline(millis, () => {})()
      expect(timeouts.mock.calls.filter(([, ms]) => (ms ?? 0) > 900_000).length).toBeLessThanOrEqual(1)
    } finally {
      timeouts.mockRestore()
    }
  })

  it("shedding cancelled deadlines behind fired ones loses no later deadline", async () => {
    const millis = 25
    const fired: Array<string> = []
    const now = Date.now()
    Timers.deadline(millis, () => fired.push("a"), now)
    Timers.deadline(millis, () => fired.push("b"), now)
    const later = ["c", "d", "e"].map((name) => Timers.deadline(millis, () => fired.push(name), now + 10_000))
    await until(() => fired.length >= 2)
    expect(fired).toEqual(["a", "b"])
    // From the tail back to the fired ones: the lane is empty, and must still take and fire a new one.
    for (const cancel of later.reverse()) cancel()
    expect(Timers.held(millis)).toBe(0)
    Timers.deadline(millis, () => fired.push("f"))
    await until(() => fired.length >= 3)
    expect(fired).toEqual(["a", "b", "f"])
  })

  it("keep-alives share one interval and stop pinging a removed stream", async () => {
    let pings = 0
    const stream: Timers.KeepAliveStream = { lastWrite: Date.now(), intervalMillis: 20, ping: () => pings++ }
    const remove = Timers.keepAlive(stream)
    await sleep(90)
    expect(pings).toBeGreaterThan(0)
    remove()
    const after = pings
    await sleep(60)
    expect(pings).toBe(after)
  })

  it("a deadline set by one that fires (an idle check re-armed) leaves one timer, not two", async () => {
    // The lane's timers, counted while they wait: one that fired or was cleared waits no more. (A
    // timer may fire a millisecond before the clock says its deadline is due, and is re-armed then:
    // timers one after another are fine, two at once are not.)
    const real = { set: globalThis.setTimeout, clear: globalThis.clearTimeout }
    const waiting = new Set<unknown>()
    let most = 0
    const set = vi.spyOn(globalThis, "setTimeout").mockImplementation(((
      fire: () => void,
      millis?: number,
    ) => {
      if (millis === 150) return real.set(fire, millis)
      const timer = real.set(() => {
        waiting.delete(timer)
        fire()
      }, millis)
      waiting.add(timer)
      most = Math.max(most, waiting.size)
      return timer
    }) as typeof setTimeout)
    const clear = vi.spyOn(globalThis, "clearTimeout").mockImplementation(((timer: NodeJS.Timeout) => {
      waiting.delete(timer)
      real.clear(timer)
    }) as typeof clearTimeout)
    try {
      let fired = 0
      // A duration no other test uses: a lane of its own.
      Timers.deadline(37, () => {
        Timers.deadline(37, () => {
          fired++
        })
      })
      await sleep(150)
      expect(fired).toBe(1)
      expect(most).toBe(1)
      expect(waiting.size).toBe(0)
    } finally {
      set.mockRestore()
      clear.mockRestore()
    }
  })

  it("short streams one after another share one interval, which stops once idle", async () => {
    const intervals = vi.spyOn(globalThis, "setInterval")
    try {
      // Past any earlier test's ticker: it stops after two ticks without streams.
      await sleep(100)
      intervals.mockClear()
      for (let i = 0; i < 10; i++) {
        const remove = Timers.keepAlive({ lastWrite: Date.now(), intervalMillis: 20, ping: () => undefined })
        remove()
      }
      expect(intervals).toHaveBeenCalledTimes(1)
      await sleep(100)
      Timers.keepAlive({ lastWrite: Date.now(), intervalMillis: 20, ping: () => undefined })()
      expect(intervals).toHaveBeenCalledTimes(2)
    } finally {
      intervals.mockRestore()
    }
  })
})
