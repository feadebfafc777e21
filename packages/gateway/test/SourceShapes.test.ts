/**
 * Shapes of code that V8 makes expensive per request, kept out of every
 * package's sources. An object literal with a getter or setter gets a hidden
 * class of its own each time it is evaluated, allocated in the old
 * generation; what its accessor captures then survives every young
 * collection until a full one. Two such literals on the dispatch path kept
 * ~12 KB of each chat completion alive (BENCHMARKS.md, "What each request
 * left to the old generation"). A class with the accessor on its prototype
 * costs nothing of the kind. A generator function made per call
 * (`Effect.gen(function* () { … })` inside a function) does the same; the
 * request path's modules declare theirs once, except where named below. So
 * does an object spread followed by a property the spread object lacks
 * (`{ ...headers, "x-request-id": id }`): V8 11 makes a hidden class for each
 * copy, ~0.8 µs against ~20 ns for the same object written as a literal
 * (docs/ARCHITECTURE.md, "Object spread"); so does a second spread that adds
 * properties. No package writes anything after a spread, except where named
 * below.
 */
import { readdirSync, readFileSync, statSync } from "node:fs"
import { join, relative } from "node:path"
import { describe, expect, it } from "@effect/vitest"
import ts from "typescript"

const ROOT = join(import.meta.dirname, "../../..")

const sourceFiles = (dir: string): Array<string> =>
  readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    if (statSync(path).isDirectory()) return name === "node_modules" ? [] : sourceFiles(path)
    return /\.(ts|tsx|mts)$/.test(name) && !name.endsWith(".d.ts") ? [path] : []
  })

const allSources = (): Array<string> =>
  ["packages", "apps"].flatMap((group) =>
    readdirSync(join(ROOT, group)).flatMap((pkg) => {
      const src = join(ROOT, group, pkg, "src")
      try {
        return statSync(src).isDirectory() ? sourceFiles(src) : []
      } catch {
        return []
      }
    }),
  )

/** `file:line` of every object literal that declares a getter or setter. */
const literalAccessors = (path: string, text: string): Array<string> => {
  const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const found: Array<string> = []
  const visit = (node: ts.Node) => {
    if (ts.isObjectLiteralExpression(node)) {
      for (const property of node.properties) {
        if (ts.isGetAccessorDeclaration(property) || ts.isSetAccessorDeclaration(property)) {
          const { line } = file.getLineAndCharacterOfPosition(property.getStart(file))
          found.push(`${relative(ROOT, path)}:${line + 1}`)
        }
      }
    }
    ts.forEachChild(node, visit)
  }
  visit(file)
  return found
}

/** The top-level declaration (or class member) a node sits in: `name` or `Class.member`. */
const ownerOf = (node: ts.Node): string => {
  let at: ts.Node = node
  while (at.parent !== undefined && !ts.isSourceFile(at.parent) && !ts.isClassDeclaration(at.parent))
    at = at.parent
  const parent = at.parent
  if (parent !== undefined && ts.isClassDeclaration(parent)) {
    const member = ts.isClassElement(at) && at.name !== undefined ? at.name.getText() : "?"
    return `${parent.name?.text ?? "?"}.${member}`
  }
  if (ts.isVariableStatement(at)) return at.declarationList.declarations[0]?.name.getText() ?? "?"
  if (ts.isFunctionDeclaration(at)) return at.name?.text ?? "?"
  return "?"
}

/** The declarations in which a generator function expression is made inside another function. */
const nestedGenerators = (path: string, text: string): Array<string> => {
  const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const found: Array<string> = []
  const visit = (node: ts.Node, insideFunction: boolean) => {
    if (insideFunction && ts.isFunctionExpression(node) && node.asteriskToken !== undefined)
      found.push(ownerOf(node))
    const isFunction = ts.isFunctionLike(node) && (node as ts.FunctionLikeDeclaration).body !== undefined
    ts.forEachChild(node, (child) => visit(child, insideFunction || isFunction))
  }
  visit(file, false)
  return [...new Set(found)].sort()
}

/**
 * The declarations with an object literal that has anything after a spread:
 * a property (`{ ...a, b }`) or another spread (`{ ...a, ...b }`, which adds
 * b's properties the same way).
 */
const propertiesAfterSpread = (path: string, text: string): Array<string> => {
  const file = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true)
  const found: Array<string> = []
  const visit = (node: ts.Node) => {
    if (ts.isObjectLiteralExpression(node)) {
      const spread = node.properties.findIndex((p) => ts.isSpreadAssignment(p))
      if (spread >= 0 && spread < node.properties.length - 1) found.push(ownerOf(node))
    }
    ts.forEachChild(node, visit)
  }
  visit(file)
  return [...new Set(found)].sort()
}

/**
 * The request path's modules, and where each may still make a generator per
 * call: paths that wait anyway, or run once.
 */
const REQUEST_PATH: Readonly<Record<string, ReadonlyArray<string>>> = {
  "packages/gateway/src/HttpServer.ts": ["listen"], // starts the server, once
  "packages/gateway/src/ChatCompletions.ts": [],
  "packages/gateway/src/Limits.ts": [],
  "packages/gateway/src/Billing.ts": [],
  "packages/gateway/src/RequestPolicy.ts": [],
  "packages/gateway/src/Models.ts": [],
  "packages/gateway/src/HttpIo.ts": [],
  "packages/gateway/src/Operations.ts": [],
  "packages/dispatch/src/strategies/Single.ts": [],
  "packages/dispatch/src/Attempt.ts": ["complete"], // consensus authors and judges
  "packages/dispatch/src/NodePool.ts": ["NodePool.claim"], // the dispatch queue's wait
  "packages/dispatch/src/HttpTransport.ts": [],
  "packages/dispatch/src/Finalizers.ts": [],
  "packages/quota/src/Quota.ts": [],
  "packages/billing/src/internal/LedgerWriter.ts": [], // behind the requests: every ledger flush
}

/**
 * Where a package may still write something after a spread, by declaration:
 * what runs once (layers, configuration, a node's setup), off the chat
 * completion's path (admin pages and API, metrics scrapes, failures), or
 * overwrites only properties the spread object has (a copy then keeps its
 * hidden class). The apps and the simulator run no gateway request.
 */
const SPREAD_ALLOWED: Readonly<Record<string, ReadonlyArray<string>>> = {
  "packages/gateway/src/HttpServer.ts": ["servedFor"], // maxTokens, which the request has
  "packages/gateway/src/Limits.ts": ["quotaLayer"], // once, when the layer is built
  "packages/gateway/src/GatewayConfig.ts": ["layer", "layerFromEnv"], // once
  "packages/gateway/src/NodeRegistry.ts": ["decorate"], // once per layer
  "packages/gateway/src/PlainMetrics.ts": ["HistogramFamily.get"], // per metrics scrape
  "packages/dispatch/src/Dispatcher.ts": ["healthOptionsOf"], // once per dispatcher
  "packages/dispatch/src/NodePool.ts": ["NodePool.statusOf"], // the node list and registrations
  "packages/dispatch/src/HttpTransport.ts": ["fromSpec"], // once per node
  "packages/dispatch/src/Presets.ts": ["applyOverrides"], // configuration
  "packages/billing/src/RedisBilling.ts": ["layerConfig", "withSince"], // once; after a Redis failure
  "packages/quota/src/Quota.ts": ["normalizeCached"], // once per limits object; subject, which it has
}
const SPREAD_UNCHECKED = ["apps/", "packages/admin/", "packages/swarm-sim/"]

describe("source shapes", () => {
  it("finds an object literal accessor when there is one (the check itself)", () => {
    const text =
      "export const f = (x: number) => ({ a: 1, get b() { return x } })\nclass C { get d() { return 1 } }\n"
    expect(literalAccessors(join(ROOT, "example.ts"), text)).toEqual(["example.ts:1"])
  })

  it("finds a generator made per call, by the declaration it is made in (the check itself)", () => {
    const text = [
      "function* once() {}",
      "export const perCall = (x: number) => Effect.gen(function* () { return x })",
      "class Pool { claim() { return Effect.gen(function* () {}) } }",
      "export const layer = Effect.gen(function* () {})",
    ].join("\n")
    expect(nestedGenerators(join(ROOT, "example.ts"), text)).toEqual(["Pool.claim", "perCall"])
  })

  it("finds a property after a spread, by the declaration it is in (the check itself)", () => {
    const text = [
      "export const fast = (a: object, b: number) => ({ b, ...a })",
      "export const slow = (a: object, id: string) => ({ ...a, id })",
      'class C { m(a: object) { return { x: { ...a, "k": 1 } } } }',
      "export const twice = (a: object, b: object) => ({ ...a, ...b })",
      "export const copy = (a: object) => ({ ...a })",
    ].join("\n")
    expect(propertiesAfterSpread(join(ROOT, "example.ts"), text)).toEqual(["C.m", "slow", "twice"])
  })

  it("no package writes anything after a spread except where named", () => {
    const files = allSources()
      .map((path) => relative(ROOT, path))
      .filter((path) => !SPREAD_UNCHECKED.some((prefix) => path.startsWith(prefix)))
    expect(files.length).toBeGreaterThan(50)
    for (const path of files) {
      const found = propertiesAfterSpread(join(ROOT, path), readFileSync(join(ROOT, path), "utf8"))
      expect({ path, found }).toEqual({ path, found: [...(SPREAD_ALLOWED[path] ?? [])].sort() })
    }
  })

  it("the request path's modules make generators per call only where named", () => {
    for (const [path, allowed] of Object.entries(REQUEST_PATH)) {
      const found = nestedGenerators(join(ROOT, path), readFileSync(join(ROOT, path), "utf8"))
      expect({ path, found }).toEqual({ path, found: [...allowed].sort() })
    }
  })

  it("no package declares a getter or setter in an object literal", () => {
    const files = allSources()
    expect(files.length).toBeGreaterThan(50)
    const found = files.flatMap((path) => literalAccessors(path, readFileSync(path, "utf8")))
    expect(found).toEqual([])
  })
})
