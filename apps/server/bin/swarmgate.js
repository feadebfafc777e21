#!/usr/bin/env node
// Runs the compiled bundle (apps/server/dist/main.js), rebuilt first when a source is newer
// (scripts/build.mjs); `npm run dev` runs the TypeScript sources with tsx instead.
import { availableParallelism } from "node:os"
import { pathToFileURL } from "node:url"
import { setFlagsFromString } from "node:v8"
import { ensureBuilt } from "../../../scripts/build.mjs"
import { v8Flags } from "./v8-flags.mjs"

// Before the bundle loads (v8-flags.mjs says why each).
for (const flag of v8Flags({
  cpus: availableParallelism(),
  execArgv: process.execArgv,
  nodeOptions: process.env.NODE_OPTIONS,
}))
  setFlagsFromString(flag)

await import(pathToFileURL(await ensureBuilt("server")).href)
