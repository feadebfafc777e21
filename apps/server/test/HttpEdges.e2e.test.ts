/**
 * HTTP edges that node:http would answer by itself, over raw sockets: every
 * answer carries an `x-request-id` (spec §1) — an unmet `Expect` (417), an
 * HTTP/1.1 request without `Host` (400 with the envelope), `CONNECT` (405 with
 * `Allow`, not a dropped connection) — and an absolute-form request target is
 * routed by its path (RFC 9112 §3.2.2).
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { expectRefusal, REQUEST_ID, rawRequest } from "./support/RawHttp"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

let server: RunningServer
let key: string
let port: number

beforeAll(async () => {
  server = await startServer({ SWARMGATE_SIM_SPEED: "200" })
  key = (await createKey(server, { balance_usd: 100 })).key
  port = Number(new URL(server.baseUrl).port)
}, 60_000)

afterAll(async () => {
  await server?.stop()
})

const chatBody = JSON.stringify({
  model: "swarm-swift",
  max_tokens: 3,
  messages: [{ role: "user", content: "Hi" }],
})

const post = (target: string, headers: ReadonlyArray<string>) =>
  `POST ${target} HTTP/1.1\r\n${headers.map((h) => `${h}\r\n`).join("")}content-type: application/json\r\ncontent-length: ${Buffer.byteLength(chatBody)}\r\n\r\n${chatBody}`

describe("answers node:http would write itself carry a request id", () => {
  it("an Expect other than 100-continue: 417, empty, with x-request-id", async () => {
    const response = await rawRequest(
      port,
      post("/v1/chat/completions", [
        "Host: gateway",
        `Authorization: Bearer ${key}`,
        "Expect: something-else",
      ]),
    )
    expect(response?.status).toBe(417)
    expect(response?.headers["x-request-id"]).toMatch(REQUEST_ID)
    expect(response?.body).toBe("")
  })

  it("an HTTP/1.1 request without Host: 400 invalid_request with the envelope", async () => {
    const response = await rawRequest(port, post("/v1/chat/completions", [`Authorization: Bearer ${key}`]))
    expect(response?.status).toBe(400)
    expect(expectRefusal(400, response!.headers, response!.body)).toBe("invalid_request")
  })

  it("CONNECT: 405 with Allow and x-request-id, not a dropped connection", async () => {
    const response = await rawRequest(
      port,
      "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
    )
    expect(response?.status).toBe(405)
    expect(response?.headers.allow).toBe("GET, HEAD, POST")
    expect(response?.headers["x-request-id"]).toMatch(REQUEST_ID)
  })
})

describe("absolute-form request targets", () => {
  it("are routed by their path: a chat completion answers 200", async () => {
    const response = await rawRequest(
      port,
      post(`http://gateway/v1/chat/completions`, ["Host: gateway", `Authorization: Bearer ${key}`]),
    )
    expect(response?.status).toBe(200)
    expect(response?.headers["x-request-id"]).toMatch(REQUEST_ID)
    expect(JSON.parse(response!.body).object).toBe("chat.completion")
  })

  it("keep the route check first: an unknown path is 404, a wrong method 405, empty", async () => {
    const unknown = await rawRequest(
      port,
      "GET http://gateway/v1/embeddings HTTP/1.1\r\nHost: gateway\r\n\r\n",
    )
    expect(unknown?.status).toBe(404)
    expect(unknown?.body).toBe("")
    const wrong = await rawRequest(
      port,
      "GET http://gateway/v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n\r\n",
    )
    expect(wrong?.status).toBe(405)
    expect(wrong?.headers.allow).toBe("POST")
  })
})
