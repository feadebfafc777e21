/**
 * The operator console in a real browser: Playwright (`playwright-core`)
 * driving the Chromium of the Debian package, headless, against the real
 * server. Sign in, approve an application, create a key (shown once) and
 * revoke it, see the usage chart drawn from real requests, see a post
 * without the CSRF token refused, sign out.
 */
import { existsSync } from "node:fs"
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { type Browser, chromium, type Page } from "playwright-core"
import { eventually, usageOf } from "./support/Billing"
import { ADMIN_TOKEN, createKey, type RunningServer, startServer } from "./support/ServerProcess"

const executablePath = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium"
const required = process.env.SWARMGATE_REQUIRE_SERVICES === "1"
const missing = !existsSync(executablePath)
if (missing && !required) console.warn(`[skipped] console browser tests: no Chromium at ${executablePath}`)

describe.skipIf(missing && !required)("the console in Chromium", () => {
  let server: RunningServer
  let browser: Browser
  let page: Page
  let applicationId: string

  const chat = (key: string) =>
    fetch(`${server.baseUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "swarm-swift",
        max_tokens: 8,
        messages: [{ role: "user", content: "hi" }],
      }),
    })

  beforeAll(async () => {
    if (missing)
      throw new Error(`console tests need Chromium at ${executablePath} (apt-get install -y chromium)`)
    server = await startServer()
    // An application waiting for review, through the public form and the outbox's link.
    const applied = await fetch(`${server.baseUrl}/apply`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        name: "Katherine Johnson",
        email: "kj@example.org",
        use_case: "Orbital mechanics",
      }),
    })
    applicationId = ((await applied.json()) as { id: string }).id
    const outbox = await server.admin<{ data: Array<{ to: string; text: string }> }>("GET", "/outbox")
    const link = outbox.body.data
      .find((m) => m.to === "kj@example.org")!
      .text.match(/http\S+apply\/verify\S+/)![0]
    expect((await fetch(link)).status).toBe(200)
    // Some traffic for the usage page.
    const { key, accountId } = await createKey(server)
    for (let i = 0; i < 3; i++) expect((await chat(key)).status).toBe(200)
    // Usage records are written behind, in batches.
    await eventually(async () => (await usageOf(server, accountId)).length === 3, 10_000)
    browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] })
    page = await browser.newPage()
  }, 60_000)

  afterAll(async () => {
    await browser?.close()
    await server?.stop()
  })

  it("asks for the admin token, refuses a wrong one, signs in with the right one", async () => {
    await page.goto(`${server.baseUrl}/console`)
    expect(new URL(page.url()).pathname).toBe("/console/login")
    await page.getByLabel("Admin token").fill("not-the-token")
    await page.getByRole("button", { name: "Sign in" }).click()
    await page.getByRole("alert").waitFor()
    expect(await page.getByRole("alert").textContent()).toContain("not the admin token")
    await page.getByLabel("Admin token").fill(ADMIN_TOKEN)
    await page.getByRole("button", { name: "Sign in" }).click()
    await page.waitForURL("**/console/applications")
    const cookies = await page.context().cookies()
    const session = cookies.find((c) => c.name === "swarmgate_console")
    expect(session).toMatchObject({ httpOnly: true, sameSite: "Strict", path: "/console" })
    expect(server.output()).not.toContain(session!.value)
    expect(server.output()).not.toContain(ADMIN_TOKEN)
  }, 30_000)

  it("approves an application with a balance and limits", async () => {
    const row = page.locator(`tr[data-application="${applicationId}"]`)
    await row.getByLabel("Balance (USD)").fill("7")
    await row.getByLabel("Concurrency").fill("3")
    await row.getByRole("button", { name: "Approve" }).click()
    await page.waitForURL("**/console/applications?notice=*")
    expect(await page.getByRole("status").textContent()).toContain("Approved Katherine Johnson")
    const application = await server.admin<{ status: string; account_id: string }>(
      "GET",
      `/applications/${applicationId}`,
    )
    expect(application.body.status).toBe("approved")
    const account = await server.admin<{ balance_usd: number; limits: { concurrency: number } }>(
      "GET",
      `/accounts/${application.body.account_id}`,
    )
    expect(account.body).toMatchObject({ balance_usd: 7, limits: { concurrency: 3 } })
    await row.getByRole("link", { name: "account" }).click()
    await page.waitForURL(`**/console/accounts/${application.body.account_id}`)
  }, 30_000)

  it("creates a key shown once, then revokes it: the key stops working", async () => {
    await page.getByLabel("New key name").fill("browser key")
    await page.getByRole("button", { name: "Create key" }).click()
    const secret = (await page.locator("#new-key").textContent())?.trim() ?? ""
    expect(secret).toMatch(/^sk-/)
    expect((await chat(secret)).status).toBe(200)
    await page.goto(page.url().replace(/\/keys$/, ""))
    expect(await page.locator("#new-key").count()).toBe(0)
    const row = page.locator("tr", { hasText: "browser key" })
    await row.getByRole("button", { name: "Revoke" }).click()
    await page.waitForURL("**notice=*")
    expect(await page.locator("tr", { hasText: "browser key" }).locator(".key-status").textContent()).toBe(
      "revoked",
    )
    expect((await chat(secret)).status).toBe(401)
  }, 30_000)

  it("draws the usage charts from real requests, with the numbers in a table", async () => {
    await page.getByRole("link", { name: "Usage" }).click()
    await page.waitForURL("**/console/usage")
    const heights = await page
      .locator("#chart-requests rect.bar")
      .evaluateAll((rects) => rects.map((r) => Number(r.getAttribute("height"))))
    expect(heights.length).toBe(14)
    expect(heights.some((h) => h > 0)).toBe(true)
    const box = await page.locator("#chart-requests svg").boundingBox()
    expect(box?.height ?? 0).toBeGreaterThan(50)
    expect(await page.locator("#usage-models").textContent()).toContain("swarm-swift")
    if (process.env.CONSOLE_SCREENSHOT)
      await page.screenshot({ path: process.env.CONSOLE_SCREENSHOT, fullPage: true })
  }, 30_000)

  it("shows the nodes and refreshes them", async () => {
    await page.getByRole("link", { name: "Nodes" }).click()
    await page.waitForURL("**/console/nodes")
    expect(await page.locator("#nodes tbody tr").count()).toBeGreaterThan(0)
    const before = await page.locator("#nodes-updated").textContent()
    await expect
      .poll(() => page.locator("#nodes-updated").textContent(), { timeout: 10_000, interval: 200 })
      .not.toBe(before)
    expect(await page.locator("#nodes tbody tr").count()).toBeGreaterThan(0)
  }, 30_000)

  it("refuses a change without the CSRF token, or from another origin", async () => {
    const application = await server.admin<{ account_id: string }>("GET", `/applications/${applicationId}`)
    const accountId = application.body.account_id
    const status = await page.evaluate(async (id) => {
      const response = await fetch(`/console/accounts/${id}/close`, {
        method: "POST",
        headers: { "content-type": "application/x-www-form-urlencoded" },
        body: "",
      })
      return response.status
    }, accountId)
    expect(status).toBe(403)
    const csrf = await page.locator('input[name="csrf"]').first().inputValue()
    const cookie = (await page.context().cookies()).find((c) => c.name === "swarmgate_console")!
    const foreign = await fetch(`${server.baseUrl}/console/accounts/${accountId}/close`, {
      method: "POST",
      redirect: "manual",
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        cookie: `${cookie.name}=${cookie.value}`,
        origin: "http://evil.example",
      },
      body: `csrf=${encodeURIComponent(csrf)}`,
    })
    expect(foreign.status).toBe(403)
    expect((await server.admin<{ status: string }>("GET", `/accounts/${accountId}`)).body.status).toBe(
      "active",
    )
  }, 30_000)

  it("signs out: the session no longer opens any page", async () => {
    await page.getByRole("button", { name: "Sign out" }).click()
    await page.waitForURL("**/console/login")
    await page.goto(`${server.baseUrl}/console/accounts`)
    expect(new URL(page.url()).pathname).toBe("/console/login")
  }, 30_000)
})

describe("the console without SWARMGATE_ADMIN_TOKEN", () => {
  it("is not there: every /console path is 404, like the admin API", async () => {
    const server = await startServer({ SWARMGATE_ADMIN_TOKEN: "" })
    try {
      for (const [method, path] of [
        ["GET", "/console"],
        ["GET", "/console/login"],
        ["POST", "/console/login"],
        ["GET", "/console/usage"],
        ["GET", "/admin/v1/accounts"],
      ] as const) {
        const response = await fetch(`${server.baseUrl}${path}`, { method, redirect: "manual" })
        expect({ path, status: response.status }).toEqual({ path, status: 404 })
      }
    } finally {
      await server.stop()
    }
  }, 60_000)
})
