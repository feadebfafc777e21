/**
 * nginx in front of gateway processes, configured from the documented example
 * `deploy/nginx.conf`: only the listen port, the upstream's servers and the
 * file paths are replaced (each replacement must match exactly once, so the
 * example cannot drift away from what is tested). Runs in the foreground
 * (`daemon off;`) with its prefix, pid, logs and temp files in a temporary
 * directory, and is stopped after the tests.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createConnection, createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"

export const EXAMPLE = fileURLToPath(new URL("../../../../deploy/nginx.conf", import.meta.url))

/** `NGINX_BIN`, `nginx` on the PATH, or the Debian package's /usr/sbin/nginx; undefined when none. */
export const nginxBinary = (): string | undefined => {
  if (process.env.NGINX_BIN) return process.env.NGINX_BIN
  try {
    return execFileSync("sh", ["-c", "command -v nginx"], { encoding: "utf8" }).trim() || undefined
  } catch {
    return existsSync("/usr/sbin/nginx") ? "/usr/sbin/nginx" : undefined
  }
}

export const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const probe = createServer()
    probe.once("error", reject)
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address()
      probe.close(() => resolve(typeof address === "object" && address !== null ? address.port : 0))
    })
  })

const replaceOnce = (text: string, pattern: RegExp, replacement: string) => {
  const matches = text.match(new RegExp(pattern.source, `${pattern.flags.replace("g", "")}g`)) ?? []
  if (matches.length !== 1)
    throw new Error(`deploy/nginx.conf: expected one match of ${pattern}, found ${matches.length}`)
  return text.replace(pattern, replacement)
}

/** The example with the test's ports and paths. */
export const configFor = (example: string, dir: string, port: number, upstreams: ReadonlyArray<string>) => {
  const servers = [...example.matchAll(/^([ \t]*)server 127\.0\.0\.1:\d+( [^;\n]*)?;$/gm)]
  if (servers.length === 0) throw new Error("deploy/nginx.conf: no upstream server lines")
  const [, indent, parameters = ""] = servers[0]!
  const lines = upstreams.map((address) => `${indent}server ${address}${parameters};`).join("\n")
  let config = example.replace(/^([ \t]*)server 127\.0\.0\.1:\d+( [^;\n]*)?;\n?/gm, "")
  config = replaceOnce(config, /^([ \t]*)least_conn;$/m, `$1least_conn;\n${lines}`)
  config = replaceOnce(config, /^([ \t]*)listen 8080;$/m, `$1listen 127.0.0.1:${port};`)
  config = replaceOnce(config, /^pid [^;]+;$/m, `pid ${join(dir, "nginx.pid")};`)
  config = replaceOnce(config, /^error_log [^;]+;$/m, `error_log ${join(dir, "error.log")} warn;`)
  config = replaceOnce(config, /^([ \t]*)access_log [^;]+;$/m, `$1access_log ${join(dir, "access.log")};`)
  const temp = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
    .map((kind) => `    ${kind}_temp_path ${join(dir, `${kind}_temp`)};`)
    .join("\n")
  config = replaceOnce(config, /^http \{$/m, `http {\n${temp}`)
  return `daemon off;\n${config}`
}

export interface RunningNginx {
  readonly baseUrl: string
  readonly config: string
  readonly process: ChildProcess
  readonly errorLog: () => string
  readonly stop: () => Promise<void>
}

const accepts = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = createConnection({ port, host: "127.0.0.1" })
    socket.once("connect", () => {
      socket.destroy()
      resolve(true)
    })
    socket.once("error", () => resolve(false))
  })

export const startNginx = async (binary: string, upstreams: ReadonlyArray<string>): Promise<RunningNginx> => {
  const dir = mkdtempSync(join(tmpdir(), "swarmgate-nginx-"))
  // Workers drop root privileges; they must still reach their temp directories.
  chmodSync(dir, 0o755)
  const port = await freePort()
  const config = configFor(readFileSync(EXAMPLE, "utf8"), dir, port, upstreams)
  const file = join(dir, "nginx.conf")
  writeFileSync(file, config)
  const child = spawn(binary, ["-p", dir, "-c", file], { stdio: ["ignore", "pipe", "pipe"] })
  let output = ""
  child.stdout?.on("data", (chunk: Buffer) => {
    output += chunk.toString()
  })
  child.stderr?.on("data", (chunk: Buffer) => {
    output += chunk.toString()
  })
  const errorLog = () => {
    const path = join(dir, "error.log")
    return `${output}${existsSync(path) ? readFileSync(path, "utf8") : ""}`
  }
  const deadline = Date.now() + 10_000
  while (!(await accepts(port))) {
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill("SIGKILL")
      throw new Error(`nginx did not start:\n${errorLog()}`)
    }
    await new Promise((r) => setTimeout(r, 50))
  }
  return {
    baseUrl: `http://127.0.0.1:${port}`,
    config,
    process: child,
    errorLog,
    stop: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve))
        child.kill("SIGTERM")
        await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))])
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
}
