#!/usr/bin/env node
// Runs the compiled bundle (apps/server/dist/main.js), rebuilt first when a source is newer
// (scripts/build.mjs); `npm run dev` runs the TypeScript sources with tsx instead.
import { pathToFileURL } from "node:url"
import { ensureBuilt } from "../../../scripts/build.mjs"

await import(pathToFileURL(await ensureBuilt("server")).href)
