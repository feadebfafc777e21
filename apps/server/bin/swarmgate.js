#!/usr/bin/env node
// Runs the compiled bundle (apps/server/dist/main.js), rebuilt first when a source is newer
// (scripts/build.mjs); `npm run dev` runs the TypeScript sources with tsx instead.
import { pathToFileURL } from "node:url"
import { setFlagsFromString } from "node:v8"
import { ensureBuilt } from "../../../scripts/build.mjs"

// V8 allocates objects from allocation sites with a high survival rate straight into the old
// generation; a request's objects live as long as the request, so they qualified, and from there
// they kept everything young they point to alive through every scavenge. With it on, today's
// gateway promotes ~20 KB per chat completion instead of ~1 and costs ~25 % more CPU
// (BENCHMARKS.md, "Found and fixed"). Read at each collection, so setting it before the bundle
// loads is in time.
setFlagsFromString("--no-allocation-site-pretenuring")

await import(pathToFileURL(await ensureBuilt("server")).href)
