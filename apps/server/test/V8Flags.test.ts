import { join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { describe, expect, it } from "@effect/vitest"

const BIN = fileURLToPath(new URL("../bin/", import.meta.url))

type V8Flags = (process: {
  readonly cpus: number
  readonly execArgv: ReadonlyArray<string>
  readonly nodeOptions: string | undefined
}) => Array<string>

const load = async () =>
  ((await import(pathToFileURL(join(BIN, "v8-flags.mjs")).href)) as { v8Flags: V8Flags }).v8Flags

describe("the bin's V8 flags", () => {
  it("never pretenure by allocation site", async () => {
    const v8Flags = await load()
    for (const cpus of [1, 2, 64])
      expect(v8Flags({ cpus, execArgv: [], nodeOptions: undefined })).toContain(
        "--no-allocation-site-pretenuring",
      )
  })

  it("scavenge on the main thread alone when the process has one CPU, in parallel otherwise", async () => {
    const v8Flags = await load()
    expect(v8Flags({ cpus: 1, execArgv: [], nodeOptions: undefined })).toContain("--no-parallel-scavenge")
    expect(v8Flags({ cpus: 2, execArgv: [], nodeOptions: "" })).not.toContain("--no-parallel-scavenge")
  })

  it("leave the young generation's threads to an operator who chose them", async () => {
    const v8Flags = await load()
    for (const chosen of [
      "--parallel-scavenge",
      "--no-parallel-scavenge",
      "--single-threaded-gc",
      "--single_threaded_gc",
    ]) {
      expect(v8Flags({ cpus: 1, execArgv: [chosen], nodeOptions: undefined })).not.toContain(
        "--no-parallel-scavenge",
      )
      expect(
        v8Flags({ cpus: 1, execArgv: [], nodeOptions: `--max-old-space-size=512 ${chosen}` }),
      ).not.toContain("--no-parallel-scavenge")
    }
    // A flag that only starts like one is not the operator's choice of threads.
    expect(
      v8Flags({ cpus: 1, execArgv: ["--parallel-scavenge-task-trace"], nodeOptions: undefined }),
    ).toContain("--no-parallel-scavenge")
  })
})
