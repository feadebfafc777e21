/**
 * The load test against real processes: a 2-second run against a node-sim,
 * and the CLI with `--spawn` against the gateway's embedded simulated swarm,
 * checking that the reports are well formed (no performance assertion).
 */
import { spawnSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { describe, expect, it } from "vitest"
import { htmlReport } from "../src/Report"
import { RESULT_SCHEMA } from "../src/Result"
import { run } from "../src/Runner"
import { startNodeSim } from "../src/Spawn"
import { checkMarkup } from "./support"

const MAIN = fileURLToPath(new URL("../src/main.ts", import.meta.url))

describe("smoke", () => {
  it("runs 2 seconds of streams against a node-sim", { timeout: 60_000 }, async () => {
    const { child, ready } = await startNodeSim(["--nodes", "2", "--speed", "50", "--capacity", "32"])
    try {
      const result = await run({
        url: `http://127.0.0.1:${ready.port}/v1/chat/completions`,
        key: "unused",
        model: "any",
        stream: true,
        maxTokens: 32,
        prompt: "How do rivers shape valleys?",
        extra: {},
        concurrency: 4,
        rate: undefined,
        durationMillis: 2000,
        warmupMillis: 0,
        timeoutMillis: 10_000,
        client: "undici",
        slo: { ttftMillis: 5000 },
        seed: 1,
      })
      expect(result.schema).toBe(RESULT_SCHEMA)
      expect(result.requests.succeeded).toBeGreaterThan(0)
      expect(result.requests.failed).toBe(0)
      expect(result.tokens.content_chunks).toBeGreaterThan(result.requests.succeeded)
      expect(result.latency_ms.ttft.count).toBe(result.requests.succeeded)
      expect(result.latency_ms.itl.count).toBeGreaterThan(0)
      expect(result.goodput?.requests).toBe(result.requests.succeeded)
      expect(checkMarkup(htmlReport(result))).toEqual([])
    } finally {
      await child.stop()
    }
  })

  it("spawns the gateway with its embedded swarm, runs, writes both reports and tears down", {
    timeout: 120_000,
  }, () => {
    const dir = mkdtempSync(join(tmpdir(), "loadtest-smoke-"))
    try {
      const cli = spawnSync(
        process.execPath,
        [
          "--import",
          "tsx",
          MAIN,
          "--spawn",
          "--spawn-node-sims",
          "0",
          "--spawn-env",
          "SWARMGATE_SIM_SPEED=50",
          "--concurrency",
          "4",
          "--duration",
          "2s",
          "--stream",
          "--max-tokens",
          "32",
          "--out",
          dir,
        ],
        { encoding: "utf8", timeout: 110_000 },
      )
      expect(cli.status, cli.stderr).toBe(0)
      expect(cli.stdout).toMatch(/requests\s+\d+ ok/)
      const result = JSON.parse(readFileSync(join(dir, "result.json"), "utf8"))
      expect(result.schema).toBe(RESULT_SCHEMA)
      expect(result.config.model).toBe("swarm-prime")
      expect(result.requests.succeeded).toBeGreaterThan(0)
      expect(result.latency_ms.ttft.count).toBe(result.requests.succeeded)
      const html = readFileSync(join(dir, "report.html"), "utf8")
      expect(checkMarkup(html)).toEqual([])
      expect(html).toContain("<svg")
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
