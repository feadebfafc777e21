/**
 * What a store (memory, Redis) implements; `Quota.make` builds the service on
 * top of it: permits in scopes, exactly-once release, the failure policy.
 */
import type { Redis } from "@swarmgate/store"
import { Data, type Effect } from "effect"
import type { QuotaPeriod, RateParams, RateState } from "./Algorithm"

export interface QuotaParams {
  readonly name: string
  readonly limit: number
  readonly period: QuotaPeriod
}

export interface ConcurrencyParams {
  readonly limit: number
  readonly queue: number
}

/** A request's limits, validated and in store units. */
export interface Normalized {
  readonly subject: string
  readonly resource: string
  readonly rates: ReadonlyArray<RateParams>
  readonly quotas: ReadonlyArray<QuotaParams>
  readonly concurrency: ConcurrencyParams | undefined
}

export type AdmitOutcome =
  | { readonly _tag: "Admitted"; readonly rates: ReadonlyArray<RateState> }
  | { readonly _tag: "Queued"; readonly rates: ReadonlyArray<RateState> }
  /** A rate limit or a quota: `waitMicros` until the request would pass (exact when nothing is pending). */
  | {
      readonly _tag: "RateLimited"
      readonly rates: ReadonlyArray<RateState>
      readonly waitMicros: number
      /** The name of the limit that decided the wait. */
      readonly limit: string
    }
  /** Slots and queue full (or a limit of 0): `waitMicros` is an estimate. */
  | {
      readonly _tag: "ConcurrencyLimited"
      readonly rates: ReadonlyArray<RateState>
      readonly waitMicros: number
    }

export type SlotOutcome =
  | { readonly _tag: "Acquired" }
  | { readonly _tag: "TimedOut"; readonly waitMicros: number }

export interface QuotaState {
  readonly limit: number
  readonly remaining: number
  readonly resetMicros: number
}

export interface StoreUsage {
  readonly concurrency: number
  readonly queued: number
  /** By resource, then by rate name. */
  readonly rates: ReadonlyMap<string, ReadonlyArray<RateState>>
  readonly quotas: ReadonlyArray<QuotaState & { readonly name: string }>
}

/** The store could not answer (Redis down, a timeout): mapped by the failure policy, never leaked. */
export class StoreUnavailable extends Data.TaggedError("StoreUnavailable")<{
  readonly reason: string
  readonly cause?: unknown
}> {}

/** A store whose decisions are synchronous (memory): the same operations as plain calls, time in µs. */
export interface StoreNow {
  /** `admit` without the queue: `undefined` (nothing changed) when the request would wait for a slot. */
  readonly admit: (request: Normalized, permit: string, nowMicros: number) => AdmitOutcome | undefined
  readonly commit: (request: Normalized, permit: string, nowMicros: number) => void
  readonly release: (request: Normalized, permit: string, committed: boolean, nowMicros: number) => void
}

export interface Store {
  /** Present when every decision can be made synchronously. */
  readonly now?: StoreNow | undefined
  /** How long a slot or reservation survives without renewal; undefined when nothing can be orphaned. */
  readonly leaseMillis: number | undefined
  /** Checks rates and quotas, reserves them and takes a slot or a queue place, all or nothing. */
  readonly admit: (request: Normalized, permit: string) => Effect.Effect<AdmitOutcome, StoreUnavailable>
  /** For a queued permit: waits for its slot, at most `maxWaitMillis`; on time-out the permit is still queued. */
  readonly awaitSlot: (
    request: Normalized,
    permit: string,
    maxWaitMillis: number,
  ) => Effect.Effect<SlotOutcome, StoreUnavailable>
  /**
   * Charges the reserved rate and quota units (generation started). Absent
   * on a store that takes the commit later instead (remote: no round trip of
   * its own at the first token), with the release or a renewal
   * (`commitAgoMicros`), charged as of when it was decided.
   */
  readonly commit?:
    | ((request: Normalized, permit: string) => Effect.Effect<void, StoreUnavailable>)
    | undefined
  /**
   * Frees the slot or queue place and drops reservations that were not
   * committed; with `commitAgoMicros` (a deferred commit), first charges the
   * permit as of that long ago if it is still pending.
   */
  readonly release: (
    request: Normalized,
    permit: string,
    committed: boolean,
    commitAgoMicros?: number,
  ) => Effect.Effect<void, StoreUnavailable>
  /**
   * Extends the permit's leases; with `commitAgoMicros`, also delivers a deferred commit (as `release`).
   * A store that must send it again later (a script Redis no longer knows) does so only while `held`
   * says the permit is still held: a renewal after the release would take its slot again.
   */
  readonly renew: (
    request: Normalized,
    permit: string,
    committed: boolean,
    commitAgoMicros?: number,
    held?: () => boolean,
  ) => Effect.Effect<void, StoreUnavailable>
  /**
   * `admit` and `release` sent at the call (`admit`'s reply is waited for
   * or observed, `release`'s Effect waits for it): a remote store's, so that
   * a caller sends them with its other commands in one write. A store that
   * has them defers commits (no `commit`).
   */
  readonly send?:
    | {
        readonly admit: (request: Normalized, permit: string) => Redis.Reply<AdmitOutcome, StoreUnavailable>
        readonly release: Store["release"]
      }
    | undefined
  /** Current state without changing it; the request's rates are read for each of `resources`. */
  readonly usage: (
    request: Normalized,
    resources: ReadonlyArray<string>,
  ) => Effect.Effect<StoreUsage, StoreUnavailable>
}
