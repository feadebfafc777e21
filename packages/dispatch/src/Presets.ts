/**
 * Model presets: what `GET /v1/models` lists and what a request's `model` selects.
 */
export interface Preset {
  readonly id: string
  readonly created: number
  readonly ownedBy: string
  readonly strategy: "single" | "consensus"
  /** Whether image parts are accepted at all (and then only by vision nodes). */
  readonly vision: boolean
  readonly maxContextTokens: number
  readonly maxOutputTokens: number
  /** Total running time before 504 `upstream_timeout`. */
  readonly timeoutMillis: number
}

/** 2026-11-01T00:00:00Z: a fixed creation time keeps `/v1/models` stable across restarts. */
const CREATED = 1_793_491_200

export const defaultPresets = (brand = "swarm"): ReadonlyArray<Preset> => [
  {
    id: `${brand}-prime`,
    created: CREATED,
    ownedBy: brand,
    strategy: "single",
    vision: true,
    maxContextTokens: 32_768,
    maxOutputTokens: 4_096,
    timeoutMillis: 300_000,
  },
  {
    id: `${brand}-swift`,
    created: CREATED,
    ownedBy: brand,
    strategy: "single",
    vision: false,
    maxContextTokens: 16_384,
    maxOutputTokens: 2_048,
    timeoutMillis: 120_000,
  },
]
