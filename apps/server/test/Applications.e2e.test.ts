/**
 * The whole lifecycle as an applicant and an operator meet it, through a real
 * SMTP server: apply over HTTP → the mail's link verifies the address → the
 * operator approves → the claim link shows the key once → the official
 * `openai` client works with it → closing the account while a stream runs
 * refuses new requests at once, lets the stream finish (charged once), then
 * the key is refused as revoked and the final statement is mailed.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import OpenAI from "openai"
import { eventually } from "./support/Billing"
import { type RunningServer, startServer } from "./support/ServerProcess"
import { linkIn, type SmtpSink, startSmtpSink } from "./support/SmtpSink"

const LONG = {
  model: "swarm-swift",
  max_tokens: 400,
  messages: [{ role: "user" as const, content: "Write a long, detailed essay about every river of Europe." }],
}

describe("applications and the account lifecycle, end to end", () => {
  let smtp: SmtpSink
  let server: RunningServer

  beforeAll(async () => {
    smtp = await startSmtpSink()
    server = await startServer({
      SWARMGATE_SMTP_URL: smtp.url,
      SWARMGATE_MAIL_FROM: "swarmgate <access@swarmgate.test>",
      SWARMGATE_SIM_SPEED: "1",
    })
  }, 60_000)

  afterAll(async () => {
    await server?.stop()
    await smtp?.stop()
  })

  it("apply → verify → approve → claim → use → close while streaming → closed", async () => {
    const email = "grace@example.org"
    const applied = await fetch(`${server.baseUrl}/apply`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "Grace", email, organization: "Navy", use_case: "Compilers" }),
    })
    expect(applied.status).toBe(202)
    const application = (await applied.json()) as { id: string; object: string; status: string }
    expect(application).toEqual({
      id: expect.stringMatching(/^app_/),
      object: "application",
      status: "pending_verification",
    })

    const verifyMail = await smtp.waitFor(email, /confirm your email/i)
    const verifyUrl = linkIn(verifyMail, `${server.baseUrl}/apply/verify?token=`)
    const verified = await fetch(verifyUrl)
    expect(verified.status).toBe(200)
    expect(verified.headers.get("content-type")).toMatch(/^text\/html/)
    // The link works once.
    expect((await fetch(verifyUrl)).status).toBe(400)

    const approved = await server.admin<{ status: string; account_id: string }>(
      "POST",
      `/applications/${application.id}/approve`,
      { balance_usd: 5, limits: { concurrency: 4, rpm: 1000 } },
    )
    expect(approved.status).toBe(200)
    expect(approved.body.status).toBe("approved")
    const accountId = approved.body.account_id
    expect(accountId).toMatch(/^acct_/)

    const claimMail = await smtp.waitFor(email, /api key/i)
    const claimUrl = linkIn(claimMail, `${server.baseUrl}/apply/claim?token=`)
    const claimPage = await fetch(claimUrl)
    expect(claimPage.status).toBe(200)
    const html = await claimPage.text()
    const key = /<output id="api-key">([^<]+)<\/output>/.exec(html)?.[1]
    expect(key).toMatch(/^sk-/)
    expect(html).toContain(`${server.baseUrl}/v1`)
    expect((await fetch(claimUrl)).status).toBe(410)
    // No log line carries the key or a token.
    expect(server.output()).not.toContain(key!)
    expect(server.output()).not.toContain(new URL(claimUrl).searchParams.get("token")!)

    const client = new OpenAI({ baseURL: `${server.baseUrl}/v1`, apiKey: key!, maxRetries: 0 })
    const models = await client.models.list()
    expect(models.data.map((m) => m.id)).toContain("swarm-swift")

    const stream = await client.chat.completions.create({
      ...LONG,
      stream: true,
      stream_options: { include_usage: true },
    })
    const iterator = stream[Symbol.asyncIterator]()
    const first = await iterator.next()
    expect(first.done).toBe(false)

    const closing = await server.admin<{ status: string }>("POST", `/accounts/${accountId}/close`)
    expect(closing.status).toBe(200)
    expect(closing.body.status).toBe("closing")
    const refused = await client.chat.completions
      .create({ model: "swarm-swift", messages: [{ role: "user", content: "hi" }] })
      .then(
        () => undefined,
        (error: unknown) => error,
      )
    expect(refused).toBeInstanceOf(OpenAI.PermissionDeniedError)
    expect((refused as InstanceType<typeof OpenAI.PermissionDeniedError>).code).toBe("account_restricted")

    // The running stream finishes normally.
    let finish: string | null | undefined
    let usage: { completion_tokens: number } | undefined | null
    for (;;) {
      const next = await iterator.next()
      if (next.done) break
      finish = next.value.choices[0]?.finish_reason ?? finish
      usage = next.value.usage ?? usage
    }
    expect(["stop", "length"]).toContain(finish)
    expect(usage?.completion_tokens).toBeGreaterThan(1)

    await eventually(
      async () =>
        (await server.admin<{ status: string }>("GET", `/accounts/${accountId}`)).body.status === "closed",
      15_000,
    )
    const afterwards = await client.models.list().then(
      () => undefined,
      (error: unknown) => error,
    )
    expect(afterwards).toBeInstanceOf(OpenAI.AuthenticationError)

    const statement = await server.admin<Record<string, number | string | null>>(
      "GET",
      `/accounts/${accountId}/statement`,
    )
    expect(statement.status).toBe(200)
    const usageRows = await server.admin<{ data: Array<{ cost_usd: number }> }>(
      "GET",
      `/usage?account_id=${accountId}`,
    )
    // Charged once: the one stream that ran.
    expect(usageRows.body.data).toHaveLength(1)
    const charged = usageRows.body.data[0]!.cost_usd
    expect(charged).toBeGreaterThan(0)
    expect(statement.body).toEqual({
      account_id: accountId,
      credits_usd: 5,
      charges_usd: charged,
      refunds_usd: 0,
      balance_usd: Math.round((5 - charged) * 1e6) / 1e6,
      closed_at: expect.any(Number),
    })
    const statementMail = await smtp.waitFor(email, /closed/i)
    expect(statementMail.text).toContain(accountId)

    // A closed account stays closed.
    const reopen = await server.admin("PATCH", `/accounts/${accountId}`, { status: "active" })
    expect(reopen.status).toBe(409)
  }, 90_000)
})

describe("the application form, as a browser without JavaScript posts it", () => {
  let server: RunningServer

  beforeAll(async () => {
    server = await startServer({ SWARMGATE_APPLY_PER_HOUR: "2" })
  }, 60_000)

  afterAll(async () => {
    await server?.stop()
  })

  const postForm = (fields: Record<string, string>, contentType = "application/x-www-form-urlencoded") =>
    fetch(`${server.baseUrl}/apply`, {
      method: "POST",
      redirect: "manual",
      headers: { "content-type": contentType },
      body: new URLSearchParams(fields).toString(),
    })

  it("serves an accessible form, answers a good post with 303, a bad one with the form marked, and bounds a client", async () => {
    const form = await fetch(`${server.baseUrl}/apply`)
    expect(form.status).toBe(200)
    const html = await form.text()
    for (const field of ["name", "email", "organization", "use_case"])
      expect(html).toMatch(new RegExp(`<label for="${field}">[^<]+</label>`))
    expect(html).toContain('<form method="post" action="/apply"')
    expect(form.headers.get("content-security-policy")).toContain("frame-ancestors 'none'")

    const good = await postForm({
      name: "Form User",
      email: "form@example.org",
      organization: "",
      use_case: "Testing",
    })
    expect(good.status).toBe(303)
    expect(good.headers.get("location")).toBe("/apply/sent")
    expect((await fetch(`${server.baseUrl}/apply/sent`)).status).toBe(200)

    const bad = await postForm({ name: "", email: "nope", use_case: "x" })
    expect(bad.status).toBe(422)
    const marked = await bad.text()
    expect(marked).toContain('role="alert"')
    expect(marked).toMatch(/id="email" name="email" aria-invalid="true"/)
    expect(marked).toContain('value="nope"')
    // Bad input changes nothing: the outbox holds only the good application's mail.
    const outbox = await server.admin<{ data: Array<{ to: string }> }>("GET", "/outbox")
    expect(outbox.body.data.map((m) => m.to)).toEqual(["form@example.org"])

    const wrongType = await postForm({ name: "x" }, "text/plain")
    expect(wrongType.status).toBe(415)

    expect(
      (await postForm({ name: "Second", email: "second@example.org", use_case: "Testing" })).status,
    ).toBe(303)
    const bounded = await postForm({ name: "Third", email: "third@example.org", use_case: "Testing" })
    expect(bounded.status).toBe(429)
    expect(Number(bounded.headers.get("retry-after"))).toBeGreaterThan(0)
    const json = await fetch(`${server.baseUrl}/apply`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "Fourth", email: "fourth@example.org", use_case: "Testing" }),
    })
    expect(json.status).toBe(429)
    expect(((await json.json()) as { error: { code: string } }).error.code).toBe("rate_limit_exceeded")
    expect(json.headers.get("x-request-id")).toMatch(/^req_/)
  }, 60_000)
})
