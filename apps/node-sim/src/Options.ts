/**
 * Command-line flags and the profile file of `node-sim`: how many nodes, from
 * which seed, and what to change in their seeded profiles.
 */
import { readFileSync } from "node:fs"
import { parseArgs } from "node:util"
import { makeProfiles, type NodeFailureRates, type NodeProfile } from "@swarmgate/swarm-sim"

export interface NodeSimOptions {
  readonly port: number
  readonly host: string
  readonly seed: number
  readonly speed: number
  /** Ids are `<prefix>NN`; without a prefix, `node-<port>-NN`. */
  readonly idPrefix: string | undefined
  /** Presets the printed node descriptions map to the node's model name. */
  readonly presets: ReadonlyArray<string>
  readonly profiles: (idPrefix: string) => ReadonlyArray<NodeProfile>
  readonly register: string | undefined
  readonly registerTtlMillis: number
  readonly adminToken: string | undefined
}

export type ProfilePatch = Partial<Omit<NodeProfile, "id" | "failure">> & {
  readonly failure?: Partial<NodeFailureRates> | undefined
}

/** `{"defaults": {...}, "nodes": [{...}, …]}`: patches for every node, then for node i. */
export interface ProfileFile {
  readonly defaults?: ProfilePatch | undefined
  readonly nodes?: ReadonlyArray<ProfilePatch> | undefined
  /** Share of dishonest nodes and their rings, as with the flags. */
  readonly dishonest?: number | undefined
  readonly rings?: number | undefined
}

export const usage = `Usage: node-sim [options]     simulated OpenAI-compatible model nodes

  --port N                   listening port (default 8100; 0 = any free port)
  --host ADDR                listening address (default 127.0.0.1)
  --seed N                   seed of the node profiles and their draws (default 42)
  --nodes N                  nodes served by this process (default 1)
  --speed X                  divides every delay (default 1; Infinity = none)
  --id-prefix P              node ids P00, P01, … (default node-<port>-)
  --presets a,b              presets the printed node entries map (default swarm-prime,swarm-swift)
  --profile FILE             JSON {"defaults": {...}, "nodes": [{...}], "dishonest", "rings"}
  Profile fields for every node (override the seeded values):
  --capacity N --ttft-ms N --ttft-jitter X --tokens-per-second N --quality X --vision true|false
  --judge-noise X --dishonest SHARE --rings N
  Failure rates (0..1): --refuse --fail-before-first-token --break-mid-stream --stall --stall-before-first-token
  --register URL             register with a gateway (POST {URL}/admin/v1/nodes) and keep the registration alive
  --register-ttl-ms N        registration lifetime; renewed every third of it (default 15000)
  --admin-token T            bearer for --register (default: $SWARMGATE_ADMIN_TOKEN)
  --help`

const number = (name: string, value: string | undefined): number | undefined => {
  if (value === undefined) return undefined
  const parsed = value === "Infinity" ? Number.POSITIVE_INFINITY : Number(value)
  if (Number.isNaN(parsed)) throw new Error(`--${name} must be a number: ${value}`)
  return parsed
}

const rate = (name: string, value: string | undefined): number | undefined => {
  const parsed = number(name, value)
  if (parsed !== undefined && !(parsed >= 0 && parsed <= 1))
    throw new Error(`--${name} must be in 0..1: ${value}`)
  return parsed
}

const bool = (name: string, value: string | undefined): boolean | undefined => {
  if (value === undefined) return undefined
  if (value === "true") return true
  if (value === "false") return false
  throw new Error(`--${name} must be true or false: ${value}`)
}

const definedOnly = <T extends object>(value: T): Partial<T> =>
  Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>

export const applyPatch = (profile: NodeProfile, patch: ProfilePatch | undefined): NodeProfile =>
  patch === undefined
    ? profile
    : {
        ...profile,
        ...definedOnly({ ...patch, failure: undefined }),
        failure: { ...profile.failure, ...definedOnly(patch.failure ?? {}) },
      }

export const parseOptions = (argv: ReadonlyArray<string>): NodeSimOptions | "help" => {
  const { values } = parseArgs({
    args: [...argv],
    strict: true,
    options: {
      port: { type: "string" },
      host: { type: "string" },
      seed: { type: "string" },
      nodes: { type: "string" },
      speed: { type: "string" },
      "id-prefix": { type: "string" },
      presets: { type: "string" },
      profile: { type: "string" },
      capacity: { type: "string" },
      "ttft-ms": { type: "string" },
      "ttft-jitter": { type: "string" },
      "tokens-per-second": { type: "string" },
      quality: { type: "string" },
      vision: { type: "string" },
      "judge-noise": { type: "string" },
      dishonest: { type: "string" },
      rings: { type: "string" },
      refuse: { type: "string" },
      "fail-before-first-token": { type: "string" },
      "break-mid-stream": { type: "string" },
      stall: { type: "string" },
      "stall-before-first-token": { type: "string" },
      register: { type: "string" },
      "register-ttl-ms": { type: "string" },
      "admin-token": { type: "string" },
      help: { type: "boolean" },
    },
  })
  if (values.help) return "help"
  const file: ProfileFile =
    values.profile === undefined ? {} : (JSON.parse(readFileSync(values.profile, "utf8")) as ProfileFile)
  const count = number("nodes", values.nodes) ?? file.nodes?.length ?? 1
  if (!Number.isInteger(count) || count < 1)
    throw new Error(`--nodes must be a positive integer: ${values.nodes}`)
  const seed = number("seed", values.seed) ?? 42
  const speed = number("speed", values.speed) ?? 1
  if (!(speed > 0)) throw new Error(`--speed must be positive: ${values.speed}`)
  const flags: ProfilePatch = {
    capacity: number("capacity", values.capacity),
    ttftMs: number("ttft-ms", values["ttft-ms"]),
    ttftJitter: rate("ttft-jitter", values["ttft-jitter"]),
    tokensPerSecond: number("tokens-per-second", values["tokens-per-second"]),
    quality: rate("quality", values.quality),
    vision: bool("vision", values.vision),
    judgeNoise: number("judge-noise", values["judge-noise"]),
    failure: {
      refuse: rate("refuse", values.refuse),
      failBeforeFirstToken: rate("fail-before-first-token", values["fail-before-first-token"]),
      breakMidStream: rate("break-mid-stream", values["break-mid-stream"]),
      stall: rate("stall", values.stall),
      stallBeforeFirstToken: rate("stall-before-first-token", values["stall-before-first-token"]),
    },
  }
  const dishonest = rate("dishonest", values.dishonest) ?? file.dishonest
  const rings = number("rings", values.rings) ?? file.rings
  return {
    port: number("port", values.port) ?? 8100,
    host: values.host ?? "127.0.0.1",
    seed,
    speed,
    idPrefix: values["id-prefix"],
    presets: (values.presets ?? "swarm-prime,swarm-swift").split(",").filter((p) => p.length > 0),
    // Ids name the process's nodes, so that two processes never share one.
    profiles: (idPrefix) =>
      makeProfiles({ seed, count, dishonest, rings }).map((profile, i) => ({
        ...applyPatch(applyPatch(applyPatch(profile, file.defaults), file.nodes?.[i]), flags),
        id: `${idPrefix}${String(i).padStart(2, "0")}`,
      })),
    register: values.register,
    registerTtlMillis: number("register-ttl-ms", values["register-ttl-ms"]) ?? 15_000,
    adminToken: values["admin-token"] ?? process.env.SWARMGATE_ADMIN_TOKEN,
  }
}
