/**
 * Summarises a V8 `.cpuprofile` (from `node --cpu-prof`): self time by
 * function and by where the code lives (a swarmgate package, Effect, the
 * tokenizer, undici, Node's internals, GC), idle time left out.
 *
 *   node --import tsx bench/profile-summary.ts FILE.cpuprofile [--top 25] [--from µs --to µs]
 */
import { readdirSync, readFileSync, statSync } from "node:fs"
import { tmpdir, userInfo } from "node:os"
import { join } from "node:path"
import { parseArgs } from "node:util"

interface CallFrame {
  readonly functionName: string
  readonly url: string
  readonly lineNumber: number
  readonly columnNumber: number
  /** Set when the position was already mapped back to its source (a bundle's frame). */
  readonly mapped?: boolean
}

interface ProfileNode {
  readonly id: number
  readonly callFrame: CallFrame
  readonly children?: ReadonlyArray<number>
}

interface CpuProfile {
  /** Microseconds of CLOCK_MONOTONIC: the clock of process.hrtime in any process on the machine. */
  readonly startTime: number
  readonly nodes: ReadonlyArray<ProfileNode>
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
}

export interface Entry {
  readonly name: string
  readonly where: string
  readonly selfMillis: number
  readonly share: number
}

export interface ProfileSummary {
  /** Sampled time the process was busy (not idle), ms. */
  readonly busyMillis: number
  readonly functions: ReadonlyArray<Entry>
  readonly areas: ReadonlyArray<Entry>
  /**
   * Each busy sample charged to the innermost swarmgate function on its stack
   * (its own code and the library code it called synchronously); samples with
   * no swarmgate frame are charged to the area of their leaf, e.g. Effect's
   * fiber runtime resuming a program between steps.
   */
  readonly owners: ReadonlyArray<Entry>
  /** Effect's own self time by its module (fiber runtime, stream channels, FiberRefs, …). */
  readonly effectModules: ReadonlyArray<Entry>
}

const isOwn = (url: string) => /\/(packages|apps)\/[^/]+\/src\//.test(url) && !url.includes("node_modules")

const IDLE = new Set(["(idle)"])

/** Where a function lives, from its script URL. */
export const areaOf = (frame: CallFrame): string => {
  const url = frame.url
  if (url === "") return frame.functionName.startsWith("(") ? frame.functionName : "(native)"
  if (url.startsWith("node:")) return "node internals"
  const module = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
  if (module !== null) return module[1] === "@swarmgate" ? "swarmgate" : module[1]!
  const own = /\/(packages|apps)\/([^/]+)\//.exec(url)
  if (own !== null) return `swarmgate/${own[2]}`
  return url.replace(/^file:\/\//, "")
}

const BASE64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

/** Generated line → sorted [generated column, original line, source index] of a source map's `mappings`. */
export const decodeMappings = (mappings: string): Array<Array<readonly [number, number, number]>> => {
  const lines: Array<Array<readonly [number, number, number]>> = []
  let originalLine = 0
  let source = 0
  for (const line of mappings.split(";")) {
    const segments: Array<readonly [number, number, number]> = []
    let column = 0
    for (const segment of line.split(",")) {
      if (segment.length === 0) continue
      const fields: Array<number> = []
      let value = 0
      let shift = 0
      for (const char of segment) {
        const digit = BASE64.indexOf(char)
        value += (digit & 31) << shift
        if (digit & 32) shift += 5
        else {
          fields.push(value & 1 ? -(value >>> 1) : value >>> 1)
          value = 0
          shift = 0
        }
      }
      column += fields[0]!
      if (fields.length >= 4) {
        source += fields[1]!
        originalLine += fields[2]!
        segments.push([column, originalLine, source])
      }
    }
    lines.push(segments)
  }
  return lines
}

/**
 * tsx runs TypeScript minified onto few lines, so a profile's positions are
 * in its output. Its cache (os.tmpdir()/tsx-<uid>) keeps each output with
 * its source map, several per file (older contents, other module formats):
 * the one that ran is the one whose code has the profile's named functions
 * at the profile's positions. Its map leads back to the TypeScript line.
 */
const tsxSourceLines = (
  frames: ReadonlyArray<CallFrame>,
): ((path: string, line: number, column: number) => number | undefined) => {
  const candidates = new Map<string, Array<{ code: string; mappings: string }>>()
  try {
    const dir = join(tmpdir(), `tsx-${userInfo().uid}`)
    for (const name of readdirSync(dir)) {
      const file = join(dir, name)
      try {
        if (!statSync(file).isFile()) continue
        const entry = JSON.parse(readFileSync(file, "utf8")) as {
          code?: string
          map?: { sources?: Array<string>; mappings?: string }
        }
        const source = entry.map?.sources?.[0]
        if (source === undefined || entry.map?.mappings === undefined || entry.code === undefined) continue
        const list = candidates.get(source) ?? []
        list.push({ code: entry.code, mappings: entry.map.mappings })
        candidates.set(source, list)
      } catch {
        // Not a transform entry.
      }
    }
  } catch {
    // No tsx cache: positions stay as they are.
  }
  const named = new Map<string, Array<CallFrame>>()
  for (const frame of frames)
    if (frame.url.startsWith("file://") && frame.functionName !== "" && !frame.functionName.startsWith("("))
      named.set(frame.url.slice(7), [...(named.get(frame.url.slice(7)) ?? []), frame])
  const score = (code: string, path: string) => {
    const lines = code.split("\n")
    let hits = 0
    for (const f of named.get(path) ?? []) {
      const line = lines[f.lineNumber] ?? ""
      if (line.slice(Math.max(0, f.columnNumber - 80), f.columnNumber + 40).includes(f.functionName)) hits++
    }
    return hits
  }
  const maps = new Map<string, Array<Array<readonly [number, number, number]>> | undefined>()
  const decoded = (path: string) => {
    if (!maps.has(path)) {
      const list = candidates.get(path) ?? []
      // Without named functions to check, only a lone candidate is trusted.
      const best =
        (named.get(path)?.length ?? 0) === 0
          ? list.length === 1
            ? list[0]
            : undefined
          : list.reduce<{ entry?: (typeof list)[number]; hits: number }>(
              (acc, entry) => {
                const hits = score(entry.code, path)
                return hits > acc.hits ? { entry, hits } : acc
              },
              { hits: 0 },
            ).entry
      maps.set(path, best === undefined ? undefined : decodeMappings(best.mappings))
    }
    return maps.get(path)
  }
  return (path, line, column) => {
    const segments = decoded(path)?.[line]
    if (segments === undefined || segments.length === 0) return undefined
    let found: number | undefined
    for (const [generated, original] of segments) {
      if (generated > column) break
      found = original
    }
    return found
  }
}

/**
 * `npm start` runs one esbuild bundle per app (`apps/<app>/dist/main.js`); its
 * source map (`main.js.map`, beside it) leads each profiled position back to
 * the module and line it came from, so the areas, Effect's modules and our
 * own functions are told apart in the bundle as under tsx.
 */
const bundleFrames = (): ((frame: CallFrame) => CallFrame) => {
  const maps = new Map<
    string,
    { readonly sources: ReadonlyArray<string>; readonly lines: ReturnType<typeof decodeMappings> } | undefined
  >()
  const mapOf = (path: string) => {
    if (!maps.has(path)) {
      try {
        const map = JSON.parse(readFileSync(`${path}.map`, "utf8")) as {
          sources: Array<string>
          mappings: string
        }
        // Paths as the repository names them: node_modules/…, packages/…, apps/….
        const sources = map.sources.map((source) => {
          const at = /(?:^|\/)((?:node_modules|packages|apps)\/.*)$/.exec(source)
          return at === null ? source : at[1]!
        })
        maps.set(path, { sources, lines: decodeMappings(map.mappings) })
      } catch {
        maps.set(path, undefined)
      }
    }
    return maps.get(path)
  }
  const root = join(import.meta.dirname, "..")
  return (frame) => {
    if (!frame.url.startsWith("file://") || !/\/dist\/main\.js$/.test(frame.url)) return frame
    const map = mapOf(frame.url.slice(7))
    const segments = map?.lines[frame.lineNumber]
    if (map === undefined || segments === undefined) return frame
    let found: readonly [number, number, number] | undefined
    for (const segment of segments) {
      if (segment[0] > frame.columnNumber) break
      found = segment
    }
    if (found === undefined) return frame
    const source = map.sources[found[2]]
    if (source === undefined) return frame
    return {
      ...frame,
      url: `file://${join(root, source)}`,
      lineNumber: found[1],
      columnNumber: 0,
      mapped: true,
    }
  }
}

const shortUrl = (url: string) => {
  const own = /\/((?:packages|apps)\/.*)$/.exec(url)
  if (own !== null) return own[1]!
  const module = /node_modules\/(.*)$/.exec(url)
  if (module !== null) return module[1]!
  return url
}

/** Only samples within `window` (monotonic µs, e.g. `process.hrtime.bigint() / 1000n` taken elsewhere) count. */
export const summarize = (
  profile: CpuProfile,
  top = 25,
  window?: { readonly fromMicros: number; readonly toMicros: number },
): ProfileSummary => {
  const fromBundle = bundleFrames()
  const byId = new Map(
    profile.nodes.map((node) => [node.id, { ...node, callFrame: fromBundle(node.callFrame) }]),
  )
  const sourceLine = tsxSourceLines(profile.nodes.map((node) => node.callFrame))
  const lineOf = (frame: CallFrame): string => {
    if (frame.mapped === true) return String(frame.lineNumber + 1)
    if (frame.url.startsWith("file://") && frame.url.endsWith(".ts")) {
      const mapped = sourceLine(frame.url.slice(7), frame.lineNumber, frame.columnNumber)
      if (mapped !== undefined) return String(mapped + 1)
      // Still the position in tsx's minified output: say so rather than print a wrong line.
      return `${frame.lineNumber + 1}:${frame.columnNumber + 1} (compiled)`
    }
    return String(frame.lineNumber + 1)
  }
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)
  const self = new Map<number, number>()
  let at = profile.startTime
  for (let i = 0; i < profile.samples.length; i++) {
    // timeDeltas[i] is the interval that ends at sample i: it belongs to that sample.
    const delta = profile.timeDeltas[i] ?? 0
    at += delta
    if (window !== undefined && (at < window.fromMicros || at > window.toMicros)) continue
    const id = profile.samples[i]!
    self.set(id, (self.get(id) ?? 0) + delta)
  }
  const functions = new Map<string, { name: string; where: string; micros: number }>()
  const areas = new Map<string, number>()
  const owners = new Map<string, number>()
  const effectModules = new Map<string, number>()
  let busy = 0
  for (const [id, micros] of self) {
    const frame = byId.get(id)?.callFrame
    if (frame === undefined || IDLE.has(frame.functionName)) continue
    busy += micros
    const name = frame.functionName === "" ? "(anonymous)" : frame.functionName
    const where = frame.url === "" ? "" : `${shortUrl(frame.url)}:${lineOf(frame)}`
    const key = `${name}\u0000${where}`
    const entry = functions.get(key) ?? { name, where, micros: 0 }
    entry.micros += micros
    functions.set(key, entry)
    const area = areaOf(frame)
    areas.set(area, (areas.get(area) ?? 0) + micros)
    if (area === "effect") {
      const module = /effect\/(?:dist\/esm|src)\/(.*)$/.exec(frame.url)?.[1] ?? frame.url
      effectModules.set(module, (effectModules.get(module) ?? 0) + micros)
    }
    let owner = `(no swarmgate frame) ${area}`
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const f = byId.get(at)?.callFrame
      if (f !== undefined && isOwn(f.url)) {
        owner = `${f.functionName === "" ? "(anonymous)" : f.functionName} ${shortUrl(f.url)}:${lineOf(f)}`
        break
      }
    }
    owners.set(owner, (owners.get(owner) ?? 0) + micros)
  }
  const entry = (name: string, where: string, micros: number): Entry => ({
    name,
    where,
    selfMillis: Math.round(micros / 100) / 10,
    share: busy === 0 ? 0 : Math.round((micros / busy) * 1000) / 10,
  })
  return {
    busyMillis: Math.round(busy / 1000),
    functions: [...functions.values()]
      .sort((a, b) => b.micros - a.micros)
      .slice(0, top)
      .map((f) => entry(f.name, f.where, f.micros)),
    areas: [...areas].sort(([, a], [, b]) => b - a).map(([area, micros]) => entry(area, "", micros)),
    owners: [...owners]
      .sort(([, a], [, b]) => b - a)
      .slice(0, top)
      .map(([owner, micros]) => entry(owner, "", micros)),
    effectModules: [...effectModules]
      .sort(([, a], [, b]) => b - a)
      .slice(0, 12)
      .map(([module, micros]) => entry(`effect/${module}`, "", micros)),
  }
}

export const readProfile = (path: string): CpuProfile => JSON.parse(readFileSync(path, "utf8")) as CpuProfile

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      top: { type: "string", default: "25" },
      from: { type: "string" },
      to: { type: "string" },
    },
  })
  const window =
    values.from === undefined
      ? undefined
      : { fromMicros: Number(values.from), toMicros: Number(values.to ?? Number.POSITIVE_INFINITY) }
  for (const file of positionals) {
    const summary = summarize(readProfile(file), Number(values.top), window)
    console.log(`${file}: ${summary.busyMillis} ms busy`)
    console.log("\nby area (self time)")
    for (const a of summary.areas)
      console.log(`${a.share.toFixed(1).padStart(6)}%  ${a.selfMillis} ms  ${a.name}`)
    console.log("\nby innermost swarmgate function on the stack")
    for (const o of summary.owners)
      console.log(`${o.share.toFixed(1).padStart(6)}%  ${o.selfMillis} ms  ${o.name}`)
    console.log("\nEffect's self time by module")
    for (const e of summary.effectModules)
      console.log(`${e.share.toFixed(1).padStart(6)}%  ${e.selfMillis} ms  ${e.name}`)
    console.log("\ntop functions (self time)")
    for (const f of summary.functions)
      console.log(
        `${f.share.toFixed(1).padStart(6)}%  ${String(f.selfMillis).padStart(8)} ms  ${f.name}  ${f.where}`,
      )
  }
}
