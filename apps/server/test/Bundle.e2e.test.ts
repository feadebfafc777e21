import { readFileSync } from "node:fs"
import { join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { describe, expect, it } from "@effect/vitest"

const ROOT = fileURLToPath(new URL("../../../", import.meta.url))

interface BuildScript {
  readonly APPS: ReadonlyArray<string>
  readonly ensureBuilt: (app: string) => Promise<string>
  readonly wideCharacter: (text: string) => string | undefined
}

describe("bundles", () => {
  it("hold no character above U+00FF, so V8 keeps their source one byte a character", async () => {
    const script = (await import(pathToFileURL(join(ROOT, "scripts/build.mjs")).href)) as BuildScript
    expect(script.wideCharacter("plain ascii é")).toBeUndefined()
    expect(script.wideCharacter("a regex /[’]/")).toContain("U+2019")
    for (const app of script.APPS) {
      const text = readFileSync(await script.ensureBuilt(app), "utf8")
      expect({ app, wide: script.wideCharacter(text) }).toEqual({ app, wide: undefined })
    }
  }, 120_000)
})
