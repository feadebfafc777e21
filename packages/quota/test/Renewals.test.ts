/**
 * Lease renewals of a remote store's running permits: one renewer for all of
 * them, driven by `Clock` (so `TestClock` here), against a store that records
 * what it is sent. Nothing is renewed after its release; renewals resume
 * after an idle spell; many permits are renewed together, once a wake each;
 * one permit's failing renewal does not stop the others'.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, Scope, TestClock } from "effect"
import type { Store } from "../src/internal/Store"
import * as Quota from "../src/Quota"

/** 400 ms leases: the renewer wakes every 100 ms. */
const LEASE = 400

interface Sent {
  readonly what: "renew" | "release"
  readonly subject: string
  readonly at: number
}

const recordingStore = (dying: Set<string> = new Set()) => {
  const sent: Array<Sent> = []
  const note = (what: Sent["what"], subject: string) =>
    Effect.flatMap(Clock.currentTimeMillis, (at) => Effect.sync(() => sent.push({ what, subject, at })))
  const store: Store = {
    leaseMillis: LEASE,
    admit: () => Effect.succeed({ _tag: "Admitted", rates: [] }),
    awaitSlot: () => Effect.succeed({ _tag: "Acquired" }),
    release: (request) => note("release", request.subject),
    renew: (request) => {
      if (dying.delete(request.subject)) return Effect.die(new Error(`renewing ${request.subject} broke`))
      return note("renew", request.subject)
    },
    usage: () => Effect.die(new Error("not used")),
  }
  return { store, sent }
}

const limits: Quota.Limits = { concurrency: { limit: 100 } }

/** Admits `subject` in a scope of its own, left open until closed by the caller. */
const hold = (quota: Quota.QuotaShape, subject: string) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const admission = yield* Scope.extend(quota.admit({ subject, limits }), scope)
    expect(admission._tag).toBe("Admitted")
    return scope
  })

const renewalsOf = (sent: ReadonlyArray<Sent>, subject: string) =>
  sent.filter((s) => s.what === "renew" && s.subject === subject).length

describe("lease renewals", () => {
  it.effect("a running permit is renewed; once released, never again", () =>
    Effect.gen(function* () {
      const { store, sent } = recordingStore()
      const quota = yield* Quota.make(store)
      const scope = yield* hold(quota, "a")
      yield* TestClock.adjust(250)
      expect(renewalsOf(sent, "a")).toBe(2)
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust(2_000)
      expect(sent.map((s) => s.what)).toEqual(["renew", "renew", "release"])
    }),
  )

  it.effect("renewals resume for a permit admitted after an idle spell", () =>
    Effect.gen(function* () {
      const { store, sent } = recordingStore()
      const quota = yield* Quota.make(store)
      yield* Scope.close(yield* hold(quota, "first"), Exit.void)
      // The renewer ends at its first wake with nothing leased.
      yield* TestClock.adjust(1_000)
      const scope = yield* hold(quota, "second")
      yield* TestClock.adjust(150)
      expect(renewalsOf(sent, "second")).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }),
  )

  it.effect("many permits: each renewed once a wake, all of a wake at one time", () =>
    Effect.gen(function* () {
      const { store, sent } = recordingStore()
      const quota = yield* Quota.make(store)
      const subjects = Array.from({ length: 50 }, (_, i) => `s${i}`)
      const scopes = yield* Effect.forEach(subjects, (subject) => hold(quota, subject))
      yield* TestClock.adjust(100)
      yield* TestClock.adjust(100)
      for (const subject of subjects) expect(renewalsOf(sent, subject)).toBe(2)
      expect(new Set(sent.map((s) => s.at))).toEqual(new Set([100, 200]))
      yield* Effect.forEach(scopes, (scope) => Scope.close(scope, Exit.void))
    }),
  )

  it.effect("a permit whose renewal dies does not stop the others' renewals, nor its own next one", () =>
    Effect.gen(function* () {
      const { store, sent } = recordingStore(new Set(["broken"]))
      const quota = yield* Quota.make(store)
      const broken = yield* hold(quota, "broken")
      const fine = yield* hold(quota, "fine")
      yield* TestClock.adjust(100)
      expect(renewalsOf(sent, "fine")).toBe(1)
      expect(renewalsOf(sent, "broken")).toBe(0)
      yield* TestClock.adjust(100)
      expect(renewalsOf(sent, "fine")).toBe(2)
      expect(renewalsOf(sent, "broken")).toBe(1)
      yield* Scope.close(broken, Exit.void)
      yield* Scope.close(fine, Exit.void)
    }),
  )
})
