// Builds one JavaScript bundle per app (apps/<app>/dist/main.js) with esbuild.
//
//   node scripts/build.mjs            every app (run by `npm install` through `prepare`)
//   node scripts/build.mjs server     one app
//
// The bins call `ensureBuilt(app)`: a bundle older than any source it is made
// from is rebuilt before it runs, so `npm start` and the end-to-end tests never
// run stale code. Production runs the bundle; `npm run dev` runs the sources.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..")
export const APPS = ["server", "node-sim", "loadtest"]

/** Native or optional modules a bundle cannot hold; they load from node_modules at run time. */
const EXTERNAL = ["better-sqlite3", "pg-native", "cpu-features", "ssh2"]

export const bundlePath = (app) => join(ROOT, "apps", app, "dist", "main.js")

/** The newest modification time among the TypeScript sources a bundle is made from. */
const newestSource = (app) => {
  let newest = 0
  const walk = (dir) => {
    let entries
    try {
      entries = readdirSync(dir, { withFileTypes: true })
    } catch {
      return
    }
    for (const entry of entries) {
      const path = join(dir, entry.name)
      if (entry.isDirectory()) walk(path)
      else if (entry.name.endsWith(".ts")) newest = Math.max(newest, statSync(path).mtimeMs)
    }
  }
  walk(join(ROOT, "apps", app, "src"))
  for (const pkg of readdirSync(join(ROOT, "packages"))) walk(join(ROOT, "packages", pkg, "src"))
  return newest
}

export const isStale = (app) => {
  try {
    return statSync(bundlePath(app)).mtimeMs < newestSource(app)
  } catch {
    return true
  }
}

/**
 * Where `text` has its first character above U+00FF, with some context, or undefined. V8 holds a
 * module's source as one byte a character only when every character fits: one typographic quote
 * left in a regular expression or a tagged template (esbuild escapes every other string) doubles
 * the server bundle's ~3 MB in memory for the life of the process.
 */
export const wideCharacter = (text) => {
  const found = /[\u0100-\uffff]/.exec(text)
  if (found === null) return undefined
  const at = found.index
  return `U+${text.charCodeAt(at).toString(16).toUpperCase().padStart(4, "0")} at ${at}: ${JSON.stringify(text.slice(Math.max(0, at - 60), at + 20))}`
}

export const build = async (app) => {
  const { build: esbuild } = await import("esbuild")
  const out = bundlePath(app)
  // Written in a directory of its own, then renamed: processes starting at once never load half a file.
  const temp = join(dirname(out), `.build-${process.pid}`)
  mkdirSync(temp, { recursive: true })
  await esbuild({
    entryPoints: [join(ROOT, "apps", app, "src", "main.ts")],
    outfile: join(temp, "main.js"),
    bundle: true,
    platform: "node",
    target: "node20",
    format: "esm",
    sourcemap: "linked",
    // Drops the comments too: one character above U+00FF in any of them (a typographic quote in
    // undici's) made V8 hold the whole source as two bytes a character (see `wideCharacter`).
    minifyWhitespace: true,
    external: EXTERNAL,
    logLevel: "warning",
    // CommonJS dependencies inside an ES module bundle still call require.
    banner: {
      js: 'import { createRequire as __createRequire } from "node:module"; const require = __createRequire(import.meta.url);',
    },
  })
  const wide = wideCharacter(readFileSync(join(temp, "main.js"), "utf8"))
  if (wide !== undefined) console.warn(`apps/${app}/dist/main.js is held as two bytes a character: ${wide}`)
  renameSync(join(temp, "main.js.map"), `${out}.map`)
  renameSync(join(temp, "main.js"), out)
  rmSync(temp, { recursive: true, force: true })
}

export const ensureBuilt = async (app) => {
  if (isStale(app)) await build(app)
  return bundlePath(app)
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const wanted = process.argv.slice(2)
  const apps = wanted.length > 0 ? wanted : APPS
  const started = Date.now()
  for (const app of apps) await build(app)
  console.log(`built ${apps.map((a) => `apps/${a}/dist/main.js`).join(", ")} in ${Date.now() - started} ms`)
}
