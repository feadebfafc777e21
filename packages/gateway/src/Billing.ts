/**
 * Money around one chat completion: a hold on the worst case before dispatch,
 * resolved exactly once when the request's scope closes, whatever ended it.
 * Nothing ran (`outcome.started` false): void, no record. Otherwise the usage
 * record gets the tokens the gateway counted and why it ended.
 */
import type { Principal } from "@swarmgate/auth"
import { Billing, type Ledger } from "@swarmgate/billing"
import { Finalizers } from "@swarmgate/dispatch"
import { AdmissionUnavailable, Observed } from "@swarmgate/protocol"
import { Cause, Clock, Context, Effect, Either, Exit, Option, Scope } from "effect"
import type { Outcome } from "./ChatCompletions"
import type { NormalizedRequest } from "./RequestPolicy"

/** A hold unsettled this long after the preset's running-time limit is expired by the sweeper. */
export const HOLD_GRACE_MILLIS = 60_000

/** How a request that reached a node ended, for its usage record; `void` when none did. */
export const usageOutcome = (
  outcome: Outcome,
  exit: Exit.Exit<unknown, unknown>,
): Billing.UsageOutcome | "void" => {
  if (!outcome.started) return "void"
  if (outcome.status !== "pending") return outcome.status
  if (Exit.isFailure(exit)) {
    // The connection closed under us (client gone, or the drain deadline at shutdown).
    if (Cause.isInterrupted(exit.cause)) return "client_disconnected"
    const failure = Cause.failureOption(exit.cause)
    if (Option.isSome(failure) && (failure.value as { _tag?: string })._tag === "UpstreamTimeout")
      return "upstream_timeout"
  }
  return "upstream_error"
}

const unavailable = () =>
  new AdmissionUnavailable({ message: "The service cannot accept the request now.", retryAfterSeconds: 1 })

/** What ran, as billing records it: settled from `outcome` (by `settled`), or voided when nothing started. */
const resolveOutcome = (
  outcome: Outcome,
  exit: Exit.Exit<unknown, unknown>,
  voided: () => Effect.Effect<unknown>,
  settled: (settlement: Billing.Settlement) => Effect.Effect<Ledger.UsageEntry | undefined>,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
): Effect.Effect<void> => {
  const ended = usageOutcome(outcome, exit)
  // Observable where the book's answer is (`Observed`): a plain close reads it by callback.
  if (ended === "void") return Observed.asVoid(voided())
  const settlement = { completionTokens: outcome.completionTokens, outcome: ended }
  const entry = settled(settlement)
  return onSettled === undefined
    ? Observed.asVoid(entry)
    : Observed.map(entry, (charged) => onSettled(settlement, charged))
}

/** What ran, as billing records it: settled from `outcome`, or voided when nothing started. */
export const settleOutcome = (
  billing: Billing.BillingShape,
  requestId: string,
  outcome: Outcome,
  exit: Exit.Exit<unknown, unknown>,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
): Effect.Effect<void> =>
  resolveOutcome(
    outcome,
    exit,
    () => billing.void(requestId),
    (settlement) => billing.settle(requestId, settlement),
    onSettled,
  )

/** `settleOutcome` for a sent hold, its script sent at the call. */
export const resolveSent = (
  holding: Billing.HoldSent,
  outcome: Outcome,
  exit: Exit.Exit<unknown, unknown>,
  now: number,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
): Effect.Effect<void> =>
  resolveOutcome(
    outcome,
    exit,
    () => holding.resolve(undefined, now),
    (settlement) => holding.resolve(settlement, now),
    onSettled,
  )

/** The wait for a sent hold (`HoldSent.hold`, or what `observe` gave); storage trouble is the service's (503), not the caller's. */
export const heldSent = (
  hold: Effect.Effect<Billing.Hold, Billing.ReserveRefusal | Billing.BillingUnavailable>,
): Effect.Effect<Billing.Hold, Billing.ReserveRefusal | AdmissionUnavailable> =>
  Effect.catchTag(hold, "BillingUnavailable", storageTrouble)

const storageTrouble = (e: Billing.BillingUnavailable) =>
  Effect.zipRight(Effect.logError(`billing: ${e.reason}`, e.cause), Effect.fail(unavailable()))

/**
 * The hold a request asks for: its worst case against every limit that
 * applies, waiting up to `waitMillis` when only other requests' holds stand
 * in the way.
 */
export const reserveInput = (
  principal: Principal,
  requestId: string,
  request: NormalizedRequest,
  waitMillis = 0,
  /** Beyond the preset's time limit and the grace: a hold placed before a queue wait lives that much longer. */
  queuedMillis = 0,
): Billing.ReserveInput => ({
  requestId,
  accountId: principal.account.id,
  keyId: principal.key.id,
  model: request.preset.id,
  promptTokens: request.promptTokens,
  maxTokens: request.maxTokens,
  paymentHold: principal.account.paymentHold,
  monthlySpendLimitMicros: principal.account.monthlySpendLimitMicros,
  keySpendLimitMicros: principal.key.spendLimitMicros,
  ttlMillis: request.preset.timeoutMillis + HOLD_GRACE_MILLIS + queuedMillis,
  waitMillis,
})

/** Places the hold; storage trouble is the service's (503), not the caller's. */
export const reserve = (
  billing: Billing.BillingShape,
  input: Billing.ReserveInput,
): Effect.Effect<Billing.Hold, Billing.ReserveRefusal | AdmissionUnavailable> =>
  Effect.catchTag(billing.reserve(input), "BillingUnavailable", storageTrouble)

/**
 * `hold` by plain calls, where the book decides at once (in memory): the
 * hold, settled (or voided) from `outcome` by a plain cleanup of `scope`, or
 * the refusal; undefined when only `hold` can decide (a remote book, a wait
 * for money), with nothing changed.
 */
export const holdNow = (
  billing: Billing.BillingShape,
  scope: Scope.Scope,
  clock: Clock.Clock,
  input: Billing.ReserveInput,
  outcome: Outcome,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
): Either.Either<Billing.Hold, Billing.ReserveRefusal | AdmissionUnavailable> | undefined => {
  const { reserveNow, settleNow, voidNow } = billing
  if (reserveNow === undefined || settleNow === undefined || voidNow === undefined) return undefined
  const now = reserveNow(input, clock.unsafeCurrentTimeMillis())
  if (now === undefined || Either.isLeft(now)) return now
  const { requestId } = input
  // A plain cleanup, not acquireRelease: no fiber-ref diff and patch, no Effect step per request.
  Finalizers.addNow(scope, (exit) => {
    const ended = usageOutcome(outcome, exit)
    if (ended === "void") {
      voidNow(requestId)
      return
    }
    const settlement = { completionTokens: outcome.completionTokens, outcome: ended }
    const entry = settleNow(requestId, settlement, clock.unsafeCurrentTimeMillis())
    onSettled?.(settlement, entry)
  })
  return now
}

/**
 * Reserves the request's worst case for `principal` (or all its limits leave,
 * with the completion cap in `Hold.maxTokens`), and in the scope's release
 * settles it from `outcome` (read when the scope closes) or voids it.
 * A book that decides at once (in memory) is used by plain calls (`holdNow`):
 * one finalizer, no Effect work for the money.
 */
export const hold = (
  principal: Principal,
  requestId: string,
  request: NormalizedRequest,
  outcome: Outcome,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
  waitMillis = 0,
): Effect.Effect<
  Billing.Hold,
  Billing.ReserveRefusal | AdmissionUnavailable,
  Billing.Billing | Scope.Scope
> =>
  Effect.withFiberRuntime((fiber) => {
    const context = fiber.currentContext
    const billing = Context.unsafeGet(context, Billing.Billing)
    const scope = Context.unsafeGet(context, Scope.Scope)
    const input = reserveInput(principal, requestId, request, waitMillis)
    const clock = Context.get(fiber.currentDefaultServices, Clock.Clock)
    return (
      holdNow(billing, scope, clock, input, outcome, onSettled) ??
      holdWaiting(billing, scope, input, outcome, onSettled)
    )
  })

/** `hold` where `holdNow` could not decide (a remote book, a wait for money): through the book's Effect path. */
export const holdWaiting = (
  billing: Billing.BillingShape,
  scope: Scope.Scope,
  input: Billing.ReserveInput,
  outcome: Outcome,
  onSettled?: (settlement: Billing.Settlement, entry: Ledger.UsageEntry | undefined) => void,
): Effect.Effect<Billing.Hold, Billing.ReserveRefusal | AdmissionUnavailable> =>
  Effect.uninterruptible(
    Effect.tap(reserve(billing, input), () =>
      Scope.addFinalizerExit(scope, (exit) =>
        settleOutcome(billing, input.requestId, outcome, exit, onSettled),
      ),
    ),
  )
