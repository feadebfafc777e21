import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterEach, describe, expect, it } from "@effect/vitest"
import { type NodeServer, startNodeServer, toInput } from "../src/NodeServer"
import { parseOptions } from "../src/Options"

const servers: Array<NodeServer> = []
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()))
})

const start = async (argv: ReadonlyArray<string>) => {
  const options = parseOptions(["--port", "0", ...argv])
  if (options === "help") throw new Error("help")
  const server = await startNodeServer(options)
  servers.push(server)
  return server
}

const post = (url: string, body: unknown, signal?: AbortSignal) =>
  fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
    ...(signal === undefined ? {} : { signal }),
  })

const question = [{ role: "user", content: "How do rivers shape valleys?" }]

/** The `data:` payloads of a stream, without [DONE]; `done` tells whether it came. */
const events = async (response: Response) => {
  const raw = await response.text()
  const frames = raw.split("\n\n").filter((f) => f.startsWith("data: "))
  return {
    done: frames.at(-1) === "data: [DONE]",
    data: frames
      .filter((f) => f !== "data: [DONE]")
      .map((f) => JSON.parse(f.slice(6)) as Record<string, never>),
  }
}

const contentOf = (data: ReadonlyArray<Record<string, never>>) =>
  data.map((d) => (d.choices as Array<{ delta: { content?: string } }>)[0]?.delta.content ?? "").join("")

describe("node-sim server", () => {
  it("serves each node at /nodes/{id} and describes them for a nodes file", async () => {
    const server = await start([
      "--nodes",
      "3",
      "--speed",
      "Infinity",
      "--id-prefix",
      "t-",
      "--presets",
      "p1,p2",
    ])
    expect(server.nodes.map((n) => n.id)).toEqual(["t-00", "t-01", "t-02"])
    expect(server.nodes[1]).toMatchObject({
      url: `http://127.0.0.1:${server.port}/nodes/t-01`,
      models: { p1: "t-01", p2: "t-01" },
    })
    const models = await (await fetch(`${server.nodes[2]!.url}/v1/models`)).json()
    expect(models).toMatchObject({ object: "list", data: [{ id: "t-02" }] })
    expect((await fetch(`http://127.0.0.1:${server.port}/nodes/nope/v1/models`)).status).toBe(404)
  })

  it("streams OpenAI chunks: the role, the pieces, the finish, [DONE]; the cap gives finish length", async () => {
    const server = await start(["--speed", "Infinity"])
    const { data, done } = await events(
      await post(server.nodes[0]!.url, { model: "m", stream: true, max_tokens: 5, messages: question }),
    )
    expect(done).toBe(true)
    expect(data[0]).toMatchObject({
      object: "chat.completion.chunk",
      model: "m",
      choices: [{ delta: { role: "assistant" } }],
    })
    expect(data.length).toBe(1 + 5 + 1)
    expect((data.at(-1)!.choices as Array<{ finish_reason: string }>)[0]!.finish_reason).toBe("length")
    expect(contentOf(data).length).toBeGreaterThan(0)
  })

  it("answers one JSON body without stream; JSON mode parses; seed pins the text; stop ends it", async () => {
    const server = await start(["--speed", "Infinity", "--nodes", "2"])
    const body = async (extra: object, node = 0) =>
      (
        (await (await post(server.nodes[node]!.url, { messages: question, ...extra })).json()) as {
          choices: Array<{ message: { content: string }; finish_reason: string }>
        }
      ).choices[0]!
    const json = await body({ response_format: { type: "json_object" }, max_tokens: 200 })
    expect(() => JSON.parse(json.message.content)).not.toThrow()
    const a = await body({ seed: 3 }, 0)
    const b = await body({ seed: 3 }, 1)
    expect(a.message.content).toBe(b.message.content)
    const word = a.message.content.split(" ")[3]!
    const stopped = await body({ seed: 3, stop: word })
    expect(a.message.content.startsWith(stopped.message.content)).toBe(true)
    expect(stopped.message.content.length).toBeLessThan(a.message.content.length)
  })

  it("refuses beyond its capacity with 429 and bad bodies with 400", async () => {
    const server = await start(["--speed", "1", "--capacity", "1", "--tokens-per-second", "5"])
    const controller = new AbortController()
    const first = await post(server.nodes[0]!.url, { stream: true, messages: question }, controller.signal)
    expect(first.status).toBe(200)
    const second = await post(server.nodes[0]!.url, { stream: true, messages: question })
    expect(second.status).toBe(429)
    controller.abort()
    expect((await post(server.nodes[0]!.url, { messages: [] })).status).toBe(400)
    expect((await post(server.nodes[0]!.url, { messages: question, max_tokens: "x" })).status).toBe(400)
    await new Promise((r) => setTimeout(r, 50))
    expect(server.stats()[0]).toMatchObject({ inFlight: 0, refusedAtCapacity: 1, aborted: 1 })
  })

  it("fails the way flags say: refuse (503), before the first token (error event), mid-stream (dropped), stall (silence)", async () => {
    const url = async (flag: string) => (await start(["--speed", "Infinity", `--${flag}`, "1"])).nodes[0]!.url
    expect((await post(await url("refuse"), { stream: true, messages: question })).status).toBe(503)

    const before = await events(
      await post(await url("fail-before-first-token"), { stream: true, messages: question }),
    )
    expect(before.done).toBe(false)
    expect(before.data).toEqual([
      { error: { message: "node failure: failed_before_first_token", type: "server_error" } },
    ])

    const broken = await post(await url("break-mid-stream"), { stream: true, messages: question })
    expect(broken.status).toBe(200)
    await expect(broken.text()).rejects.toThrow()

    const stallServer = await start(["--speed", "Infinity", "--stall-before-first-token", "1"])
    const controller = new AbortController()
    const stalled = post(stallServer.nodes[0]!.url, { stream: true, messages: question }, controller.signal)
    await new Promise((r) => setTimeout(r, 200))
    expect(stallServer.stats()[0]!.inFlight).toBe(1)
    controller.abort()
    await expect(stalled).rejects.toThrow()
    await new Promise((r) => setTimeout(r, 50))
    expect(stallServer.stats()[0]).toMatchObject({ inFlight: 0, aborted: 1 })
  })

  it("judges: a judge prompt is answered with one letter", async () => {
    const server = await start(["--speed", "Infinity", "--judge-noise", "0"])
    const ask = (a: string, b: string) =>
      post(server.nodes[0]!.url, {
        max_tokens: 4,
        messages: [
          { role: "system", content: "judge" },
          {
            role: "user",
            content: `Question:\n<<<\nWhat is it?\n>>>\n\nAnswer A:\n<<<\n${a}\n>>>\n\nAnswer B:\n<<<\n${b}\n>>>\n\nWhich answer is better? Reply with the single letter A or B.`,
          },
        ],
      }).then(
        async (r) =>
          ((await r.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message
            .content,
      )
    expect(["A", "B"]).toContain(await ask("one", "two"))
  })
})

describe("options", () => {
  it("flags override the seeded profiles; the profile file patches every node and each node", () => {
    const dir = mkdtempSync(join(tmpdir(), "node-sim-"))
    const file = join(dir, "profile.json")
    writeFileSync(
      file,
      JSON.stringify({
        defaults: { capacity: 3, failure: { refuse: 0.5 } },
        nodes: [{ quality: 0.1 }, { vision: true, failure: { stall: 1 } }],
        dishonest: 0.5,
      }),
    )
    const options = parseOptions([
      "--profile",
      file,
      "--ttft-ms",
      "77",
      "--break-mid-stream",
      "0.25",
      "--seed",
      "9",
    ])
    if (options === "help") throw new Error("help")
    const profiles = options.profiles("x-")
    expect(profiles).toHaveLength(2)
    expect(profiles.map((p) => p.id)).toEqual(["x-00", "x-01"])
    expect(profiles[0]).toMatchObject({ capacity: 3, ttftMs: 77, quality: 0.1 })
    expect(profiles[0]!.failure).toEqual({
      refuse: 0.5,
      failBeforeFirstToken: 0,
      breakMidStream: 0.25,
      stall: 0,
    })
    expect(profiles[1]).toMatchObject({ capacity: 3, vision: true })
    expect(profiles[1]!.failure).toMatchObject({ refuse: 0.5, stall: 1, breakMidStream: 0.25 })
    expect(profiles.filter((p) => p.ring !== undefined)).toHaveLength(1)
  })

  it("refuses bad values with a message naming the flag", () => {
    expect(() => parseOptions(["--refuse", "2"])).toThrow("--refuse must be in 0..1")
    expect(() => parseOptions(["--nodes", "0"])).toThrow("--nodes")
    expect(() => parseOptions(["--speed", "-1"])).toThrow("--speed")
    expect(() => parseOptions(["--vision", "maybe"])).toThrow("--vision")
    expect(() => parseOptions(["--bogus"])).toThrow()
    expect(parseOptions(["--help"])).toBe("help")
  })

  it("reads OpenAI request bodies: text and image parts, caps, stop, JSON mode", () => {
    expect(
      toInput({
        messages: [
          {
            role: "user",
            content: [
              { type: "text", text: "Look" },
              { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
            ],
          },
        ],
        max_completion_tokens: 9,
        stop: "x",
        seed: 1,
        temperature: 0,
        response_format: { type: "json_object" },
      }),
    ).toEqual({
      messages: [{ role: "user", content: "Look" }],
      maxTokens: 9,
      jsonMode: true,
      seed: 1,
      temperature: 0,
      stop: ["x"],
      images: [{ mediaType: "image/png", bytes: 3 }],
    })
    expect(toInput({ messages: [{ role: "user", content: 5 }] })).toBe(
      "content must be a string or a list of parts",
    )
    expect(toInput({})).toBe("messages must be a non-empty array")
  })
})
