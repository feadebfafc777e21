/**
 * Plain-call paths hand on an Effect that is often already its outcome (an
 * `Exit` is an Effect): `exitOf` reads it as one, typed, without running it.
 */
import { type Effect, Exit } from "effect"

/** `effect` as the `Exit` it already is; undefined for an Effect that must run. */
export const exitOf = <A, E>(effect: Effect.Effect<A, E>): Exit.Exit<A, E> | undefined =>
  Exit.isExit(effect) ? (effect as Exit.Exit<A, E>) : undefined
