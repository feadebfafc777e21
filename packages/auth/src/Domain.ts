/**
 * Accounts and keys as the rest of the system sees them. Money is integer
 * micro-dollars; times are Unix milliseconds.
 */
import { Schema } from "effect"

export const AccountId = Schema.String.pipe(Schema.brand("AccountId"))
export type AccountId = typeof AccountId.Type
export const KeyId = Schema.String.pipe(Schema.brand("KeyId"))
export type KeyId = typeof KeyId.Type

/**
 * `closing`: new requests are refused while running ones finish; then `closed`
 * (final: every key revoked, statement sent).
 */
export const AccountStatus = Schema.Literal("active", "suspended", "restricted", "closing", "closed")
export type AccountStatus = typeof AccountStatus.Type

/** The statuses an operator sets directly; closing goes through the close operation. */
export const SettableAccountStatus = Schema.Literal("active", "suspended", "restricted")

/** Per-account limits; an absent field means "use the configured default". */
export const AccountLimits = Schema.Struct({
  concurrency: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  queue: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  rpm: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  rph: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  daily: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  weekly: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
})
export type AccountLimits = typeof AccountLimits.Type

export interface Account {
  readonly id: AccountId
  readonly name: string
  readonly status: AccountStatus
  readonly paymentHold: boolean
  readonly balanceMicros: number
  readonly monthlySpendLimitMicros: number | null
  readonly limits: AccountLimits
  readonly createdAt: number
  /** Where mail for the account goes; null for accounts made without one. */
  readonly email: string | null
  /** False after an address change until its link is followed: the keys get 403 account_restricted. */
  readonly emailVerified: boolean
  readonly closedAt: number | null
}

export type KeyState = "active" | "disabled" | "revoked" | "expired"

export interface ApiKey {
  readonly id: KeyId
  readonly accountId: AccountId
  readonly prefix: string
  readonly name: string | null
  readonly disabled: boolean
  readonly revokedAt: number | null
  readonly expiresAt: number | null
  readonly spendLimitMicros: number | null
  readonly createdAt: number
}

export const keyState = (key: ApiKey, now: number): KeyState =>
  key.revokedAt !== null
    ? "revoked"
    : key.disabled
      ? "disabled"
      : key.expiresAt !== null && key.expiresAt <= now
        ? "expired"
        : "active"

/** Who is calling: the key and its account, as of the last cache fill. */
export interface Principal {
  readonly key: ApiKey
  readonly account: Account
}

export const MICROS_PER_USD = 1_000_000
export const usdToMicros = (usd: number): number => Math.round(usd * MICROS_PER_USD)
export const microsToUsd = (micros: number): number => micros / MICROS_PER_USD
