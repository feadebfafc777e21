/**
 * Shapes of code that V8 makes expensive per request, kept out of every
 * package's sources. An object literal with a getter or setter gets a hidden
 * class of its own each time it is evaluated, allocated in the old
 * generation; what its accessor captures then survives every young
 * collection until a full one. Two such literals on the dispatch path kept
 * ~12 KB of each chat completion alive (BENCHMARKS.md, "What each request
 * left to the old generation"). A class with the accessor on its prototype
 * costs nothing of the kind.
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

describe("source shapes", () => {
  it("finds an object literal accessor when there is one (the check itself)", () => {
    const text =
      "export const f = (x: number) => ({ a: 1, get b() { return x } })\nclass C { get d() { return 1 } }\n"
    expect(literalAccessors(join(ROOT, "example.ts"), text)).toEqual(["example.ts:1"])
  })

  it("no package declares a getter or setter in an object literal", () => {
    const files = allSources()
    expect(files.length).toBeGreaterThan(50)
    const found = files.flatMap((path) => literalAccessors(path, readFileSync(path, "utf8")))
    expect(found).toEqual([])
  })
})
