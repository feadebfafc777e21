/** @internal */
export interface Prng {
  /** Uniform in [0, 1). */
  readonly next: () => number
  readonly nextUint32: () => number
  /** Uniform integer in [0, n). */
  readonly int: (n: number) => number
  readonly pick: <A>(items: ReadonlyArray<A>) => A
  /** Always consumes one draw so that the sequence does not depend on `p`. */
  readonly chance: (p: number) => boolean
  readonly shuffle: <A>(items: ReadonlyArray<A>) => Array<A>
}

/** FNV-1a, 32 bits, followed by a murmur3 finalizer to spread short inputs. */
export const hashString = (text: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  h ^= h >>> 16
  h = Math.imul(h, 0x85ebca6b)
  h ^= h >>> 13
  h = Math.imul(h, 0xc2b2ae35)
  h ^= h >>> 16
  return h >>> 0
}

// Hashing the decimal form keeps fractional (Math.random()) and >32-bit seeds distinct.
export const seedOf = (value: number): number => hashString(`seed:${value}`)

/** mulberry32: tiny, fast and good enough for a simulator. */
export const makePrng = (seed: number): Prng => {
  let state = seed >>> 0
  const nextUint32 = (): number => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return (t ^ (t >>> 14)) >>> 0
  }
  const next = (): number => nextUint32() / 4294967296
  const int = (n: number): number => Math.floor(next() * n)
  return {
    next,
    nextUint32,
    int,
    pick: (items) => items[int(items.length)]!,
    chance: (p) => next() < p,
    shuffle: (items) => {
      const out = [...items]
      for (let i = out.length - 1; i > 0; i--) {
        const j = int(i + 1)
        const tmp = out[i]!
        out[i] = out[j]!
        out[j] = tmp
      }
      return out
    },
  }
}
