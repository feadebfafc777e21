/**
 * The in-memory book under random interleavings of reserve, settle, void,
 * expire, credit, refresh and month changes, checked against a plain model
 * after every step.
 */
import { describe, expect, it } from "@effect/vitest"
import { FastCheck as fc } from "effect"
import { Book, type Hold, startOfUtcMonth } from "../src/internal/Book"
import type { Price } from "../src/Prices"

/** One micro-dollar per token: a hold of `p` prompt and `c` completion tokens costs p + c. */
const UNIT: Price = { promptMicrosPerMillion: 1_000_000, completionMicrosPerMillion: 1_000_000 }

const DAY = 86_400_000
const START = Date.UTC(2026, 0, 30, 12)

interface AccountSpec {
  readonly balance: number
  readonly monthly: number | null
  readonly paymentHold: boolean
}

const accountSpec = fc.record({
  balance: fc.integer({ min: 0, max: 10_000 }),
  monthly: fc.option(fc.integer({ min: 0, max: 20_000 }), { nil: null }),
  paymentHold: fc.boolean(),
})

const keySpec = fc.record({
  account: fc.nat(),
  limit: fc.option(fc.integer({ min: 0, max: 15_000 }), { nil: null }),
})

type Op =
  | {
      readonly op: "reserve"
      readonly key: number
      readonly prompt: number
      readonly maxTokens: number
      readonly ttl: number
    }
  | { readonly op: "settle"; readonly hold: number; readonly fraction: number }
  | { readonly op: "void"; readonly hold: number }
  | { readonly op: "tick"; readonly millis: number }
  | { readonly op: "expire" }
  | { readonly op: "credit"; readonly account: number; readonly amount: number }
  | { readonly op: "write"; readonly account: number }
  | { readonly op: "refresh"; readonly account: number }

const op: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      op: fc.constant("reserve" as const),
      key: fc.nat(),
      prompt: fc.integer({ min: 0, max: 1_000 }),
      maxTokens: fc.integer({ min: 1, max: 3_000 }),
      ttl: fc.integer({ min: 1, max: 5_000 }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant("settle" as const),
      hold: fc.nat(),
      fraction: fc.double({ min: 0, max: 1.5, noNaN: true }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("void" as const), hold: fc.nat() }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("tick" as const),
      millis: fc.oneof(fc.integer({ min: 0, max: 3_000 }), fc.integer({ min: 0, max: 20 * DAY })),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ op: "expire" as const }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant("credit" as const),
      account: fc.nat(),
      amount: fc.integer({ min: 0, max: 5_000 }),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("write" as const), account: fc.nat() }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant("refresh" as const), account: fc.nat() }) },
)

type HoldState = "open" | "settled" | "voided" | "expired"

const run = (
  accounts: ReadonlyArray<AccountSpec>,
  rawKeys: ReadonlyArray<{ account: number; limit: number | null }>,
  ops: ReadonlyArray<Op>,
) => {
  const keys = rawKeys.map((k) => ({ ...k, account: k.account % accounts.length }))
  const book = new Book()
  let now = START
  // The model: what the book must agree with.
  const credits = accounts.map((a) => a.balance)
  const charged = accounts.map(() => 0)
  const writtenCharges = accounts.map(() => 0)
  const keySpent = keys.map(() => 0)
  const monthSpent = new Map<string, number>()
  const holds: Array<{ hold: Hold; key: number; state: HoldState; resolutions: number }> = []

  for (const [i, a] of accounts.entries()) book.addAccount(`a${i}`, a.balance, 0, now)
  for (const i of keys.keys()) book.addKey(`k${i}`, 0)

  const openHeld = (match: (h: (typeof holds)[number]) => boolean) =>
    holds.filter((h) => h.state === "open" && match(h)).reduce((sum, h) => sum + h.hold.amountMicros, 0)

  const resolve = (entry: (typeof holds)[number], state: HoldState) => {
    entry.state = state
    entry.resolutions += 1
  }

  const check = () => {
    accounts.forEach((spec, i) => {
      const a = book.account(`a${i}`, now)!
      const held = openHeld((h) => keys[h.key]!.account === i)
      const available = a.balance - a.held
      // Conservation: available + held + charged = every credit ever made.
      expect(available + a.held + charged[i]!).toBe(credits[i])
      expect(a.held).toBe(held)
      expect(a.balance - a.held).toBeGreaterThanOrEqual(0)
      expect(a.held).toBeGreaterThanOrEqual(0)
      expect(a.unwritten).toBe(charged[i]! - writtenCharges[i]!)
      const month = startOfUtcMonth(now)
      expect(a.spentMonth).toBe(monthSpent.get(`${i}:${month}`) ?? 0)
      if (spec.monthly !== null) {
        for (const [k, v] of monthSpent)
          if (k.startsWith(`${i}:`)) expect(v).toBeLessThanOrEqual(spec.monthly)
        expect(a.spentMonth + a.held).toBeLessThanOrEqual(spec.monthly)
      }
    })
    keys.forEach((spec, i) => {
      const k = book.keys.get(`k${i}`)!
      expect(k.spent).toBe(keySpent[i])
      expect(k.held).toBe(openHeld((h) => h.key === i))
      if (spec.limit !== null) expect(k.spent + k.held).toBeLessThanOrEqual(spec.limit)
    })
    expect(book.holds.size).toBe(holds.filter((h) => h.state === "open").length)
  }

  let n = 0
  for (const step of ops) {
    switch (step.op) {
      case "reserve": {
        const key = step.key % keys.length
        const i = keys[key]!.account
        const spec = accounts[i]!
        const limit = keys[key]!.limit
        const a = book.account(`a${i}`, now)!
        // The model of spec §5.7: a limit whose headroom (settled spend only) cannot pay the prompt and one
        // token refuses, first in the documented order; then, when the open holds leave less than that, wait;
        // else hold the worst case or all that is free, with the cap that buys.
        const minimum = step.prompt + 1
        const accountHeld = openHeld((h) => keys[h.key]!.account === i)
        const limits: Array<{ left: number; held: number; refusal: string }> = [
          {
            left: credits[i]! - charged[i]!,
            held: accountHeld,
            refusal: spec.paymentHold ? "payment_hold" : "insufficient_balance",
          },
        ]
        if (spec.monthly !== null)
          limits.push({
            left: spec.monthly - a.spentMonth,
            held: accountHeld,
            refusal: "account_spend_limit",
          })
        if (limit !== null)
          limits.push({
            left: limit - keySpent[key]!,
            held: openHeld((h) => h.key === key),
            refusal: "key_spend_limit",
          })
        const refused = limits.find((l) => l.left < minimum)
        const free = Math.min(...limits.map((l) => l.left - l.held))
        const expected = refused !== undefined ? refused.refusal : free < minimum ? "held_by_others" : "held"
        const result = book.reserve(
          {
            requestId: `r${n++}`,
            accountId: `a${i}`,
            keyId: `k${key}`,
            model: "m",
            promptTokens: step.prompt,
            paymentHold: spec.paymentHold,
            monthlySpendLimitMicros: spec.monthly,
            keySpendLimitMicros: limit,
          },
          UNIT,
          step.maxTokens,
          now,
          step.ttl,
        )
        if (typeof result === "string") expect(result).toBe(expected)
        else {
          expect(expected).toBe("held")
          const amount = Math.min(step.prompt + step.maxTokens, free)
          expect(result.amountMicros).toBe(amount)
          expect(result.maxTokens).toBe(amount - step.prompt)
          holds.push({ hold: result, key, state: "open", resolutions: 0 })
        }
        break
      }
      case "settle": {
        if (holds.length === 0) break
        const entry = holds[step.hold % holds.length]!
        const cost = Math.round(entry.hold.amountMicros * step.fraction)
        const charge = book.settle(entry.hold.requestId, cost, now)
        if (entry.state !== "open") {
          expect(charge).toBeUndefined()
          break
        }
        const i = keys[entry.key]!.account
        const expectedCharge = Math.min(cost, entry.hold.amountMicros)
        expect(charge?.chargedMicros).toBe(expectedCharge)
        resolve(entry, "settled")
        charged[i]! += expectedCharge
        keySpent[entry.key]! += expectedCharge
        const slot = `${i}:${startOfUtcMonth(now)}`
        monthSpent.set(slot, (monthSpent.get(slot) ?? 0) + expectedCharge)
        break
      }
      case "void": {
        if (holds.length === 0) break
        const entry = holds[step.hold % holds.length]!
        const voided = book.void(entry.hold.requestId)
        if (entry.state !== "open") expect(voided).toBeUndefined()
        else {
          expect(voided).toBe(entry.hold)
          resolve(entry, "voided")
        }
        break
      }
      case "tick":
        now += step.millis
        break
      case "expire": {
        const expired = new Set(book.expire(now).map((h) => h.requestId))
        for (const entry of holds) {
          const due = entry.state === "open" && entry.hold.expiresAt <= now
          expect(expired.has(entry.hold.requestId)).toBe(due)
          if (due) resolve(entry, "expired")
        }
        break
      }
      case "credit": {
        const i = step.account % accounts.length
        book.credit(`a${i}`, step.amount)
        credits[i]! += step.amount
        break
      }
      case "write": {
        const i = step.account % accounts.length
        book.written(`a${i}`, charged[i]! - writtenCharges[i]!)
        writtenCharges[i] = charged[i]!
        break
      }
      case "refresh": {
        // SQL holds credits − written charges; the book adds back what is not yet written.
        const i = step.account % accounts.length
        book.refresh(`a${i}`, credits[i]! - writtenCharges[i]!, now)
        break
      }
    }
    check()
  }
  // Past every expiry, nothing stays open and every hold was resolved exactly once.
  now += 10_000
  const expired = new Set(book.expire(now).map((h) => h.requestId))
  for (const entry of holds) {
    expect(expired.has(entry.hold.requestId)).toBe(entry.state === "open")
    if (entry.state === "open") resolve(entry, "expired")
  }
  check()
  expect(book.holds.size).toBe(0)
  for (const entry of holds) expect(entry.resolutions).toBe(1)
}

describe("Book", () => {
  it.prop(
    "conserves money, never goes below zero or past a limit, resolves every hold once",
    [
      fc.array(accountSpec, { minLength: 1, maxLength: 3 }),
      fc.array(keySpec, { minLength: 1, maxLength: 4 }),
      fc.array(op, { maxLength: 120 }),
    ],
    ([accounts, keys, ops]) => run(accounts, keys, ops),
    { fastCheck: { numRuns: 500 } },
  )

  it("settles once: a second settle, a settle after void and a void after settle do nothing", () => {
    const book = new Book()
    book.addAccount("a", 1_000, 0, START)
    book.addKey("k", 0)
    const request = {
      accountId: "a",
      keyId: "k",
      model: "m",
      promptTokens: 1,
      paymentHold: false,
      monthlySpendLimitMicros: null,
      keySpendLimitMicros: null,
    }
    book.reserve({ ...request, requestId: "r1" }, UNIT, 399, START, 1_000)
    expect(book.settle("r1", 300, START)?.chargedMicros).toBe(300)
    expect(book.settle("r1", 300, START)).toBeUndefined()
    expect(book.void("r1")).toBeUndefined()
    book.reserve({ ...request, requestId: "r2" }, UNIT, 399, START, 1_000)
    expect(book.void("r2")?.amountMicros).toBe(400)
    expect(book.settle("r2", 100, START)).toBeUndefined()
    expect(book.accounts.get("a")).toMatchObject({ balance: 700, held: 0, spentMonth: 300 })
  })

  it("charges no more than the hold", () => {
    const book = new Book()
    book.addAccount("a", 1_000, 0, START)
    book.addKey("k", 0)
    book.reserve(
      {
        requestId: "r",
        accountId: "a",
        keyId: "k",
        model: "m",
        promptTokens: 1,
        paymentHold: false,
        monthlySpendLimitMicros: null,
        keySpendLimitMicros: null,
      },
      UNIT,
      399,
      START,
      1_000,
    )
    expect(book.settle("r", 900, START)?.chargedMicros).toBe(400)
    expect(book.accounts.get("a")?.balance).toBe(600)
  })

  it("startOfUtcMonth is the first instant of the UTC month of any instant, asked in any order", () => {
    const instants = fc.array(
      fc.oneof(
        fc.integer({ min: 0, max: 4_102_444_800_000 }),
        // The edges of months: the last and the first millisecond.
        fc.integer({ min: 0, max: 1_200 }).map((m) => Date.UTC(1970, m, 1) + (m % 2 === 0 ? 0 : -1)),
      ),
      { minLength: 1, maxLength: 50 },
    )
    fc.assert(
      fc.property(instants, (all) => {
        for (const now of all) {
          const date = new Date(now)
          expect(startOfUtcMonth(now)).toBe(Date.UTC(date.getUTCFullYear(), date.getUTCMonth(), 1))
        }
      }),
    )
  })
})
