/**
 * Spec §5: "Revoking a key invalidates it at once; applications using it stop
 * working." A stream running with a key that is revoked (or disabled, or whose
 * account is suspended) ends with the final SSE `upstream_error` event — on
 * this instance, and on another one sharing the key store through Redis — and
 * is charged for what ran; a JSON request gets the key's refusal.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { pairSkipped, usePair } from "./support/InstancePair"
import { createKey, type RunningServer, startServer } from "./support/ServerProcess"

// A long answer at real speed: it would run for tens of seconds if nothing stopped it.
const LONG = {
  model: "swarm-swift",
  max_tokens: 2_000,
  messages: [{ role: "user", content: "Write a long, detailed essay about every river of Europe." }],
}

interface Streamed {
  readonly events: Array<string>
  readonly ended: Promise<number>
}

/** Starts a stream and resolves `ended` (with the time it ended) when the server closes it. */
const stream = async (server: RunningServer, key: string): Promise<Streamed> => {
  const response = await fetch(`${server.baseUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ ...LONG, stream: true }),
  })
  expect(response.status).toBe(200)
  const events: Array<string> = []
  const reader = response.body!.getReader()
  const decoder = new TextDecoder()
  let buffer = ""
  let first: () => void = () => undefined
  const started = new Promise<void>((resolve) => {
    first = resolve
  })
  const ended = (async () => {
    while (true) {
      const { value, done } = await reader.read()
      if (done) return Date.now()
      buffer += decoder.decode(value, { stream: true })
      let at = buffer.indexOf("\n\n")
      while (at >= 0) {
        const event = buffer.slice(0, at)
        buffer = buffer.slice(at + 2)
        if (event.startsWith("data: ")) {
          events.push(event.slice(6))
          if (events.length >= 3) first()
        }
        at = buffer.indexOf("\n\n")
      }
    }
  })()
  await started
  return { events, ended }
}

const expectCutByRevocation = async (streamed: Streamed, revokedAt: number) => {
  const endedAt = await streamed.ended
  // Ended soon after the revocation — far sooner than the answer itself would have (tens of seconds).
  expect(endedAt - revokedAt).toBeLessThan(5_000)
  const last = JSON.parse(streamed.events.at(-1)!) as { error?: { code: string; type: string } }
  expect(last.error).toMatchObject({ code: "upstream_error", type: "server_error" })
  expect(streamed.events).not.toContain("[DONE]")
}

describe("revocation on one instance", () => {
  let server: RunningServer
  beforeAll(async () => {
    server = await startServer({ SWARMGATE_SIM_SPEED: "1" })
  }, 60_000)
  afterAll(async () => {
    await server?.stop()
  })

  it("revoking a key ends its running stream with the final error event, charged for what ran", async () => {
    const { key, keyId, accountId } = await createKey(server, { balance_usd: 100 })
    const streamed = await stream(server, key)
    const revokedAt = Date.now()
    expect((await server.admin("POST", `/keys/${keyId}/revoke`)).status).toBe(200)
    await expectCutByRevocation(streamed, revokedAt)
    // Settled for what ran: one usage record, upstream_error, with the tokens that were sent.
    let usage: Array<{ outcome: string; completion_tokens: number }> = []
    for (let i = 0; i < 50 && usage.length === 0; i++) {
      usage = (await server.admin<{ data: typeof usage }>("GET", `/usage?account_id=${accountId}`)).body.data
      if (usage.length === 0) await new Promise((r) => setTimeout(r, 100))
    }
    expect(usage).toHaveLength(1)
    expect(usage[0]!.outcome).toBe("upstream_error")
    expect(usage[0]!.completion_tokens).toBeGreaterThan(0)
    // And the key is refused from now on.
    const after = await fetch(`${server.baseUrl}/v1/models`, { headers: { authorization: `Bearer ${key}` } })
    expect(after.status).toBe(401)
  })

  it("disabling a key or suspending its account ends its streams too; other changes do not", async () => {
    const { key, keyId, accountId } = await createKey(server, { balance_usd: 100 })
    // A change that leaves the key usable (a new spend limit) stops nothing: the stream runs on,
    // or has ended by itself with [DONE], never with the error event.
    const untouched = await stream(server, key)
    expect((await server.admin("PATCH", `/keys/${keyId}`, { spend_limit_usd: 50 })).status).toBe(200)
    await new Promise((r) => setTimeout(r, 300))
    expect(untouched.events.some((e) => e.includes('"error"'))).toBe(false)

    const disabled = await stream(server, key)
    const disabledAt = Date.now()
    expect((await server.admin("PATCH", `/keys/${keyId}`, { disabled: true })).status).toBe(200)
    await expectCutByRevocation(disabled, disabledAt)

    const other = await createKey(server, { balance_usd: 100 })
    const suspended = await stream(server, other.key)
    const suspendedAt = Date.now()
    expect(
      (await server.admin("PATCH", `/accounts/${other.accountId}`, { status: "suspended" })).status,
    ).toBe(200)
    await expectCutByRevocation(suspended, suspendedAt)
    expect(accountId).not.toBe(other.accountId)
  })

  it("a JSON request running when its key is revoked gets the key's refusal", async () => {
    const { key, keyId, accountId } = await createKey(server, { balance_usd: 100 })
    const pending = fetch(`${server.baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(LONG),
    })
    // Revoked the moment the request is running (it holds its account's concurrency slot).
    for (let i = 0; i < 200; i++) {
      const account = await server.admin<{ usage_now?: { concurrency: number } }>(
        "GET",
        `/accounts/${accountId}`,
      )
      if ((account.body.usage_now?.concurrency ?? 0) > 0) break
      await new Promise((r) => setTimeout(r, 5))
    }
    expect((await server.admin("POST", `/keys/${keyId}/revoke`)).status).toBe(200)
    const response = await pending
    expect(response.status).toBe(401)
    const body = (await response.json()) as { error: { code: string }; request_id: string }
    expect(body.error.code).toBe("invalid_api_key")
    expect(body.request_id).toBe(response.headers.get("x-request-id"))
  })
})

describe.skipIf(pairSkipped)("revocation across two instances", () => {
  let a: RunningServer
  let b: RunningServer
  usePair("revoke", {}, (first, second) => {
    a = first
    b = second
  })

  it("revoking through one instance ends the stream running on the other", async () => {
    const { key, keyId } = await createKey(a, { balance_usd: 100 })
    const onB = await stream(b, key)
    const revokedAt = Date.now()
    expect((await a.admin("POST", `/keys/${keyId}/revoke`)).status).toBe(200)
    await expectCutByRevocation(onB, revokedAt)
  })
})
