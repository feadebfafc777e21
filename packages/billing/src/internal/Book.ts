import { IdTable } from "@swarmgate/protocol"
import { costMicros, type Price } from "../Prices"

/**
 * The in-memory book of one gateway instance: balances, holds and spend, with
 * every check-and-update done synchronously, so two requests can never both
 * pass a check that only one of them fits. No I/O here; `Billing.ts` loads it
 * from the ledger and writes its charges back.
 */

export interface AccountBook {
  /** Credits − charges, counting charges not yet written to the ledger. */
  balance: number
  /** Sum of the open holds of the account. */
  held: number
  /** Charges settled here but not yet committed: SQL's balance is this much higher. */
  unwritten: number
  /** Start (Unix ms) of the UTC month `spentMonth` belongs to. */
  month: number
  spentMonth: number
  /** When the balance was last read from SQL (throttles refreshes after refusals). */
  checkedAt: number
}

export interface KeyBook {
  /** All-time charges of the key, counting those not yet written. */
  spent: number
  held: number
}

export interface Hold {
  readonly requestId: string
  readonly accountId: string
  readonly keyId: string
  readonly model: string
  readonly promptTokens: number
  readonly amountMicros: number
  /** The completion cap the hold pays for: the request's own, or less when that is all the limits leave. */
  readonly maxTokens: number
  readonly createdAt: number
  readonly expiresAt: number
}

export interface HoldRequest {
  readonly requestId: string
  readonly accountId: string
  readonly keyId: string
  readonly model: string
  readonly promptTokens: number
  readonly paymentHold: boolean
  readonly monthlySpendLimitMicros: number | null
  readonly keySpendLimitMicros: number | null
}

export type Refusal = "insufficient_balance" | "payment_hold" | "account_spend_limit" | "key_spend_limit"

/** Only the holds of the account's other running requests stand in the way: waiting for them may help. */
export const HELD_BY_OTHERS = "held_by_others"
export type Shortfall = Refusal | typeof HELD_BY_OTHERS

/** One money limit: what is left under it counting settled spend only, and the open holds against it. */
export interface Headroom {
  readonly left: number
  readonly held: number
  readonly refusal: Refusal
}

export interface Granted {
  readonly amountMicros: number
  readonly maxTokens: number
}

/** The largest completion cap in [1, maxTokens] whose cost fits in `budget` (which covers cap 1). */
export const affordableTokens = (
  price: Price,
  promptTokens: number,
  maxTokens: number,
  budget: number,
): number => {
  if (price.completionMicrosPerMillion === 0) return maxTokens
  const room = budget * 1_000_000 - promptTokens * price.promptMicrosPerMillion
  let cap = Math.max(1, Math.min(maxTokens, Math.floor(room / price.completionMicrosPerMillion)))
  // Guard the float division at the edges: the answer is exact by the cost function itself.
  while (cap > 1 && costMicros(price, promptTokens, cap) > budget) cap--
  while (cap < maxTokens && costMicros(price, promptTokens, cap + 1) <= budget) cap++
  return cap
}

/**
 * What a request may hold (spec §5.7, §7.3 rule 4): a limit that cannot pay
 * the prompt and one completion token from what is left under it refuses (a
 * No code: retrying does not help); otherwise, when the other requests' holds
 * leave less than that minimum, the request must wait for them; otherwise it
 * holds its worst case, or all that is left with the completion capped at
 * what that buys. Limits are checked in order; the first that refuses names
 * the code.
 */
export const grant = (
  price: Price,
  promptTokens: number,
  maxTokens: number,
  limits: ReadonlyArray<Headroom>,
): Granted | Shortfall => {
  const minimum = costMicros(price, promptTokens, Math.min(1, maxTokens))
  let free = Number.POSITIVE_INFINITY
  for (const limit of limits) {
    if (limit.left < minimum) return limit.refusal
    free = Math.min(free, limit.left - limit.held)
  }
  if (free < minimum) return HELD_BY_OTHERS
  const worst = costMicros(price, promptTokens, maxTokens)
  if (worst <= free) return { amountMicros: worst, maxTokens }
  const cap = affordableTokens(price, promptTokens, maxTokens, free)
  return { amountMicros: costMicros(price, promptTokens, cap), maxTokens: cap }
}

export interface Charge {
  readonly hold: Hold
  /** What the account pays: the cost of what ran, never more than the hold. */
  readonly chargedMicros: number
}

/** The last month computed, [start, end): each request asks, and a `Date` per ask showed in profiles. */
let monthStart = 0
let monthEnd = 0

export const startOfUtcMonth = (now: number): number => {
  if (now >= monthStart && now < monthEnd) return monthStart
  const date = new Date(now)
  const start = Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1)
  monthStart = start
  monthEnd = Date.UTC(date.getUTCFullYear(), date.getUTCMonth() + 1, 1)
  return start
}

export class Book {
  readonly accounts = new Map<string, AccountBook>()
  readonly keys = new Map<string, KeyBook>()
  /** Open holds by request id: one added and one removed per request (protocol/IdTable.ts says why not a Map). */
  readonly holds = new IdTable<Hold>()

  addAccount(id: string, balance: number, spentMonth: number, now: number): void {
    if (this.accounts.has(id)) return
    this.accounts.set(id, {
      balance,
      held: 0,
      unwritten: 0,
      month: startOfUtcMonth(now),
      spentMonth,
      checkedAt: now,
    })
  }

  addKey(id: string, spent: number): void {
    if (this.keys.has(id)) return
    this.keys.set(id, { spent, held: 0 })
  }

  /** The account with its monthly figure moved to the month of `now`. */
  account(id: string, now: number): AccountBook | undefined {
    const account = this.accounts.get(id)
    if (account === undefined) return undefined
    const month = startOfUtcMonth(now)
    if (month > account.month) {
      account.month = month
      account.spentMonth = 0
    }
    return account
  }

  /** Called with the account whose hold was just released (settled, voided, expired). */
  onRelease: ((accountId: string) => void) | undefined

  /**
   * Holds what `grant` allows against the balance, the monthly limit and the
   * key's limit (open holds count against all three), or says why it cannot.
   * The account and the key must be loaded.
   */
  reserve(
    request: HoldRequest,
    price: Price,
    maxTokens: number,
    now: number,
    ttlMillis: number,
  ): Hold | Shortfall {
    if (this.holds.has(request.requestId)) throw new Error(`duplicate hold ${request.requestId}`)
    const account = this.account(request.accountId, now)
    const key = this.keys.get(request.keyId)
    if (account === undefined || key === undefined) throw new Error("reserve before load")
    const limits: Array<Headroom> = [
      {
        left: account.balance,
        held: account.held,
        refusal: request.paymentHold ? "payment_hold" : "insufficient_balance",
      },
    ]
    const monthly = request.monthlySpendLimitMicros
    if (monthly !== null)
      limits.push({ left: monthly - account.spentMonth, held: account.held, refusal: "account_spend_limit" })
    const keyLimit = request.keySpendLimitMicros
    if (keyLimit !== null)
      limits.push({ left: keyLimit - key.spent, held: key.held, refusal: "key_spend_limit" })
    const granted = grant(price, request.promptTokens, maxTokens, limits)
    if (typeof granted === "string") return granted
    const hold: Hold = {
      requestId: request.requestId,
      accountId: request.accountId,
      keyId: request.keyId,
      model: request.model,
      promptTokens: request.promptTokens,
      amountMicros: granted.amountMicros,
      maxTokens: granted.maxTokens,
      createdAt: now,
      expiresAt: now + ttlMillis,
    }
    account.held += granted.amountMicros
    key.held += granted.amountMicros
    this.holds.set(hold.requestId, hold)
    return hold
  }

  private release(requestId: string): Hold | undefined {
    const hold = this.holds.get(requestId)
    if (hold === undefined) return undefined
    this.holds.delete(requestId)
    this.accounts.get(hold.accountId)!.held -= hold.amountMicros
    this.keys.get(hold.keyId)!.held -= hold.amountMicros
    this.onRelease?.(hold.accountId)
    return hold
  }

  /** Turns the hold into a charge of `costMicros` (capped at the hold); undefined when already resolved. */
  settle(requestId: string, costMicros: number, now: number): Charge | undefined {
    const hold = this.release(requestId)
    if (hold === undefined) return undefined
    const charged = Math.max(0, Math.min(costMicros, hold.amountMicros))
    const account = this.account(hold.accountId, now)!
    account.balance -= charged
    account.unwritten += charged
    account.spentMonth += charged
    this.keys.get(hold.keyId)!.spent += charged
    return { hold, chargedMicros: charged }
  }

  /** Drops the hold without a charge; undefined when already resolved. */
  void(requestId: string): Hold | undefined {
    return this.release(requestId)
  }

  /** Voids every hold past its expiry: the money returns to the account. */
  expire(now: number): ReadonlyArray<Hold> {
    const expired: Array<Hold> = []
    for (const hold of this.holds.values()) if (hold.expiresAt <= now) expired.push(hold)
    for (const hold of expired) this.release(hold.requestId)
    return expired
  }

  credit(accountId: string, amount: number): void {
    const account = this.accounts.get(accountId)
    if (account !== undefined) account.balance += amount
  }

  /** The ledger committed `amount` of this account's charges. */
  written(accountId: string, amount: number): void {
    this.accounts.get(accountId)!.unwritten -= amount
  }

  /** SQL's balance (credits − committed charges) as read while no write was in progress. */
  refresh(accountId: string, sqlBalance: number, now: number): void {
    const account = this.accounts.get(accountId)
    if (account === undefined) return
    account.balance = sqlBalance - account.unwritten
    account.checkedAt = now
  }
}
