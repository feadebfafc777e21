/**
 * The memory store counts what is pending, and the release trusts the
 * permit's flag to say whether the store counted a commit: the two must
 * change in one step, whatever interrupts the commit.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, Fiber, Scope } from "effect"
import * as Quota from "../src/Quota"

/** Real time plus `later`, read after a yield: an interruption can land in the read. */
let later = 0
const real = Clock.make()
const yieldingClock: Clock.Clock = {
  ...real,
  unsafeCurrentTimeMillis: () => real.unsafeCurrentTimeMillis() + later,
  currentTimeMillis: Effect.zipRight(
    Effect.yieldNow(),
    Effect.sync(() => real.unsafeCurrentTimeMillis() + later),
  ),
}

describe("Quota on the memory store", () => {
  it.effect(
    "a commit interrupted at any point leaves nothing reserved: the quota counts exactly what committed",
    () =>
      Effect.gen(function* () {
        const quota = yield* Effect.provide(Quota.Quota, Quota.layerMemory())
        const request = {
          subject: "acct_interrupted",
          resource: "m",
          limits: { quotas: [{ name: "daily", limit: 3, period: "day" as const }] },
        }
        let committed = 0
        for (let round = 0; round < 3; round++) {
          const scope = yield* Scope.make()
          const admission = yield* Scope.extend(quota.admit(request), scope)
          if (admission._tag !== "Admitted") throw new Error(`round ${round}: ${admission._tag}`)
          const commit = yield* Effect.fork(admission.permit.commit)
          // The commit starts and, where it reads the time, yields: the interruption lands there.
          yield* Effect.yieldNow()
          yield* Fiber.interrupt(commit)
          if (yield* admission.permit.isCommitted) committed++
          yield* Scope.close(scope, Exit.void)
        }
        expect((yield* quota.usage(request)).quotas[0]?.remaining).toBe(3 - committed)
        // Two days on, the day's count is gone; a reservation left behind would still be there.
        later = 2 * 86_400_000
        expect((yield* quota.usage(request)).quotas[0]?.remaining).toBe(3)
      }).pipe(Effect.withClock(yieldingClock)),
  )
})
