#!/usr/bin/env node
// Runs the TypeScript sources directly: no build step between `git clone` and `npm start`.
import { register } from "tsx/esm/api"

register()
await import("../src/main.ts")
