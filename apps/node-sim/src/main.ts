/**
 * `node-sim`: simulated OpenAI-compatible nodes for load tests and end-to-end
 * tests. Prints one JSON line `{"event":"listening",…,"nodes":[…]}` whose
 * `nodes` entries can go straight into a nodes file.
 */
import { startNodeServer } from "./NodeServer"
import { parseOptions, usage } from "./Options"
import { register } from "./Registration"

const log = (line: Record<string, unknown>) => console.log(JSON.stringify(line))

const main = async () => {
  const options = parseOptions(process.argv.slice(2))
  if (options === "help") {
    console.log(usage)
    return
  }
  const server = await startNodeServer(options)
  log({ event: "listening", host: server.host, port: server.port, nodes: server.nodes })
  const registration =
    options.register === undefined
      ? undefined
      : register(options.register, options.adminToken, server.nodes, options.registerTtlMillis, log)
  const stop = async () => {
    await registration?.stop()
    await server.close()
    process.exit(0)
  }
  process.once("SIGTERM", stop)
  process.once("SIGINT", stop)
}

main().catch((error: unknown) => {
  console.error(`node-sim: ${(error as Error).message}\n\n${usage}`)
  process.exit(2)
})
