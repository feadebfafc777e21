import { describe, expect, it } from "vitest"
import { endpointOf, parseDuration, parseOptions, parseSlo } from "../src/Options"

describe("parseDuration", () => {
  it("reads milliseconds, seconds, minutes and bare seconds", () => {
    expect(parseDuration("500ms")).toBe(500)
    expect(parseDuration("1.5s")).toBe(1500)
    expect(parseDuration("30s")).toBe(30_000)
    expect(parseDuration("2m")).toBe(120_000)
    expect(parseDuration("10")).toBe(10_000)
    expect(parseDuration("250us")).toBe(0.25)
  })

  it("refuses what is not a duration", () => {
    expect(() => parseDuration("soon")).toThrow(/not a duration/)
    expect(() => parseDuration("-1s")).toThrow(/not a duration/)
    expect(() => parseDuration("3 days")).toThrow(/not a duration/)
  })
})

describe("parseSlo", () => {
  it("reads vLLM's goodput syntax in milliseconds", () => {
    expect(parseSlo("ttft:500,tpot:50,e2el:2000")).toEqual({
      ttftMillis: 500,
      tpotMillis: 50,
      e2elMillis: 2000,
    })
    expect(parseSlo("tpot=20")).toEqual({ tpotMillis: 20 })
  })

  it("names an unknown metric or a bad value", () => {
    expect(() => parseSlo("itl:5")).toThrow(/unknown metric itl/)
    expect(() => parseSlo("ttft:abc")).toThrow(/positive number/)
    expect(() => parseSlo("")).toThrow(/at least one/)
  })
})

describe("endpointOf", () => {
  it("appends the chat-completions route unless it is there", () => {
    expect(endpointOf("http://h:1")).toBe("http://h:1/v1/chat/completions")
    expect(endpointOf("http://h:1/")).toBe("http://h:1/v1/chat/completions")
    expect(endpointOf("http://h:1/v1")).toBe("http://h:1/v1/chat/completions")
    expect(endpointOf("http://h:1/nodes/a/v1/chat/completions")).toBe(
      "http://h:1/nodes/a/v1/chat/completions",
    )
  })
})

describe("parseOptions", () => {
  it("takes the documented command line", () => {
    const options = parseOptions(
      [
        "--url",
        "http://127.0.0.1:8080",
        "--key",
        "sk-1",
        "--model",
        "swarm-swift",
        "--concurrency",
        "16",
        "--duration",
        "30s",
        "--stream",
        "--rate",
        "12.5",
        "--goodput",
        "ttft:500",
      ],
      {},
    )
    expect(options).toMatchObject({
      url: "http://127.0.0.1:8080/v1/chat/completions",
      key: "sk-1",
      model: "swarm-swift",
      concurrency: 16,
      durationMillis: 30_000,
      stream: true,
      rate: 12.5,
      slo: { ttftMillis: 500 },
      client: "undici",
      maxTokens: 128,
      spawn: undefined,
    })
  })

  it("takes the key from the environment and needs a URL without --spawn", () => {
    expect(parseOptions(["--url", "http://h"], { SWARMGATE_KEY: "sk-env" })).toMatchObject({ key: "sk-env" })
    expect(() => parseOptions(["--key", "k"], {})).toThrow(/--url is required/)
    expect(() => parseOptions(["--url", "http://h"], {})).toThrow(/--key is required/)
  })

  it("describes the spawned setup", () => {
    const options = parseOptions(
      [
        "--spawn",
        "--spawn-node-sims",
        "0",
        "--spawn-env",
        "SWARMGATE_SIM_SPEED=50",
        "--spawn-env",
        "LOG_LEVEL=info",
        "--spawn-node-args=--speed 20 --capacity 64",
      ],
      {},
    )
    expect(options).toMatchObject({
      spawn: {
        nodeSims: 0,
        nodesPerSim: 4,
        nodeSimArgs: ["--speed", "20", "--capacity", "64"],
        env: { SWARMGATE_SIM_SPEED: "50", LOG_LEVEL: "info" },
      },
    })
  })

  it("refuses bad values with the flag's name", () => {
    const base = ["--url", "http://h", "--key", "k"]
    expect(() => parseOptions([...base, "--concurrency", "0"], {})).toThrow(/--concurrency/)
    expect(() => parseOptions([...base, "--client", "curl"], {})).toThrow(/--client/)
    expect(() => parseOptions([...base, "--extra", "[1]"], {})).toThrow(/--extra/)
    expect(() => parseOptions([...base, "--max-tokens", "1.5"], {})).toThrow(/--max-tokens/)
    expect(() => parseOptions([...base, "--spawn-env", "NOEQUALS"], {})).toThrow(/KEY=VALUE/)
    expect(() => parseOptions([...base, "--bogus"], {})).toThrow()
    expect(parseOptions(["--help"], {})).toBe("help")
  })
})
