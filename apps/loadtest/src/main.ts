/**
 * `loadtest`: runs one load test, prints a summary, writes result.json and
 * report.html. With `--spawn` it starts (and stops) its own gateway.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { type CliOptions, parseOptions, usage } from "./Options"
import { htmlReport, textSummary } from "./Report"
import { type Progress, run } from "./Runner"
import { type Setup, spawnSetup } from "./Spawn"

const progressLine = (p: Progress) =>
  `\r[${(p.elapsedMillis / 1000).toFixed(1).padStart(6)}s/${(p.totalMillis / 1000).toFixed(0)}s]${
    p.warmingUp ? " warm-up" : ""
  } ${p.completed} ok ${p.errors} err  ${p.rps.toFixed(0)} req/s  ${p.chunksPerSecond.toFixed(0)} chunks/s  in flight ${p.inFlight}  e2e p50 ${
    Number.isFinite(p.e2eP50Millis) ? p.e2eP50Millis.toFixed(2) : "–"
  } ms   `

const outputs = (options: CliOptions) => {
  if (options.jsonPath !== undefined || options.htmlPath !== undefined)
    return { json: options.jsonPath, html: options.htmlPath }
  const dir = options.outDir ?? join("reports", `loadtest-${new Date().toISOString().replace(/[:.]/g, "-")}`)
  return { json: join(dir, "result.json"), html: join(dir, "report.html") }
}

const write = (path: string, text: string) => {
  mkdirSync(dirname(path), { recursive: true })
  writeFileSync(path, text)
}

const main = async () => {
  const parsed = parseOptions(process.argv.slice(2))
  if (parsed === "help") {
    console.log(usage)
    return
  }
  let options: CliOptions = parsed
  let setup: Setup | undefined
  const stopper = new AbortController()
  const interrupt = () => stopper.abort()
  process.once("SIGINT", interrupt)
  process.once("SIGTERM", interrupt)
  try {
    if (options.spawn !== undefined) {
      setup = await spawnSetup(options.spawn, options.concurrency)
      options = { ...options, url: setup.url, key: setup.key }
      if (!options.quiet)
        console.error(
          `spawned swarmgate (pid ${setup.gatewayPid}) at ${setup.url} with ${setup.nodes || "embedded"} nodes`,
        )
    }
    const live = options.progress || process.stderr.isTTY === true
    const result = await run(options, {
      onProgress: live ? (p) => process.stderr.write(progressLine(p)) : undefined,
      signal: stopper.signal,
      label: options.label,
    })
    if (live) process.stderr.write("\n")
    const files = outputs(options)
    if (files.json !== undefined) write(files.json, `${JSON.stringify(result, null, 2)}\n`)
    if (files.html !== undefined) write(files.html, htmlReport(result))
    if (!options.quiet) {
      console.log(textSummary(result))
      for (const file of [files.json, files.html]) if (file !== undefined) console.log(`wrote ${file}`)
    }
    if (result.requests.succeeded === 0) process.exitCode = 1
  } finally {
    await setup?.stop()
  }
}

main().catch((error: unknown) => {
  console.error(`loadtest: ${(error as Error).message}\n\n${usage}`)
  process.exit(2)
})
