/**
 * The operator console at `/console`: server-rendered pages over the admin
 * API's own operations (the same validation and the same objects), so it
 * works without JavaScript; the nodes page refreshes itself with a small
 * script. Sign in with the admin token; every change is a form post that
 * must carry the session's CSRF token and come from our own origin. Off
 * (every path 404) without `SWARMGATE_ADMIN_TOKEN`.
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { SqlClient } from "@effect/sql"
import { Dispatcher } from "@swarmgate/dispatch"
import { GatewayConfig, HttpIo } from "@swarmgate/gateway"
import { Database } from "@swarmgate/store"
import { Clock, Effect, Option, Redacted } from "effect"
import * as Admin from "./Admin"
import { AdminConfig } from "./AdminConfig"
import type { AdminError } from "./AdminErrors"
import * as AdminNodes from "./AdminNodes"
import { ApplicationStatus, type ApplicationView } from "./Applications"
import { barChart } from "./Charts"
import * as ConsoleSession from "./ConsoleSession"
import { h, page, Raw, raw, redirect, sendHtml } from "./Html"

export const CONSOLE_PREFIX = "/console"
const MAX_FORM_BYTES = 16 * 1024
const USAGE_DAYS = 14
const DAY = 86_400_000

export type ConsoleServices = Admin.AdminServices | Dispatcher.Dispatcher | GatewayConfig.GatewayConfig

// --- frame --------------------------------------------------------------------------

const SECTIONS = [
  ["applications", "Applications"],
  ["accounts", "Accounts"],
  ["usage", "Usage"],
  ["nodes", "Nodes"],
] as const

const nav = (current: string, session: ConsoleSession.Session) =>
  h`<header class="bar"><strong>swarmgate console</strong><nav aria-label="Console"><ul style="display:flex;gap:1rem;list-style:none;margin:0;padding:0">${SECTIONS.map(
    ([path, label]) =>
      h`<li><a href="/console/${path}"${current === path ? h` aria-current="page"` : ""}>${label}</a></li>`,
  )}</ul></nav><form method="post" action="/console/logout">${csrfField(session)}<button type="submit" class="secondary">Sign out</button></form></header>`

const csrfField = (session: ConsoleSession.Session) =>
  h`<input type="hidden" name="csrf" value="${session.csrf}">`

const notice = (url: URL) => {
  const text = url.searchParams.get("notice")
  return text === null ? "" : h`<p class="note" role="status">${text.slice(0, 300)}</p>`
}

const usd = (n: number | null) =>
  n === null ? "—" : `$${n.toFixed(n >= 100 ? 2 : n === 0 || n >= 0.01 ? 4 : 6)}`
const when = (seconds: number | null) =>
  seconds === null ? "—" : new Date(seconds * 1000).toISOString().replace(".000Z", "Z")

// --- pages -----------------------------------------------------------------------------

const loginPage = (problem?: string) =>
  page(
    "Sign in",
    h`<h1>Sign in to the console</h1>
${problem === undefined ? "" : h`<p class="error" role="alert">${problem}</p>`}
<form method="post" action="/console/login">
<label for="token">Admin token</label>
<input type="password" id="token" name="token" autocomplete="current-password" required>
<p><button type="submit">Sign in</button></p>
</form>`,
  )

const applicationRow = (app: ApplicationView, session: ConsoleSession.Session) =>
  h`<tr data-application="${app.id}"><td><code>${app.id}</code></td><td>${app.name}<br><small>${app.email}</small></td><td>${app.organization ?? "—"}</td><td>${app.use_case}</td><td>${app.status}${app.reason === null ? "" : h`<br><small>${app.reason}</small>`}</td><td>${when(app.created)}</td><td>${
    app.status === "pending_review"
      ? h`<form method="post" action="/console/applications/${app.id}/approve" class="row">${csrfField(session)}
<div><label for="balance-${app.id}">Balance (USD)</label><input type="number" step="any" min="0" id="balance-${app.id}" name="balance_usd" value="5" style="width:7rem"></div>
<div><label for="concurrency-${app.id}">Concurrency</label><input type="number" min="0" id="concurrency-${app.id}" name="concurrency" style="width:6rem"></div>
<div><label for="rpm-${app.id}">Requests/min</label><input type="number" min="0" id="rpm-${app.id}" name="rpm" style="width:6rem"></div>
<button type="submit">Approve</button></form>
<form method="post" action="/console/applications/${app.id}/reject" class="row">${csrfField(session)}
<div><label for="reason-${app.id}">Reason</label><input type="text" id="reason-${app.id}" name="reason" required maxlength="2000"></div>
<button type="submit" class="danger">Reject</button></form>`
      : app.account_id === null
        ? ""
        : h`<a href="/console/accounts/${app.account_id}">account</a>`
  }</td></tr>`

const applicationsPage = (url: URL, session: ConsoleSession.Session) =>
  Effect.gen(function* () {
    const status = url.searchParams.get("status")
    const filter =
      status !== null && (ApplicationStatus.literals as ReadonlyArray<string>).includes(status)
        ? status
        : null
    const list = (yield* Admin.listApplications(filter)) as { data: ReadonlyArray<ApplicationView> }
    return page(
      "Applications",
      h`<h1>Applications</h1>${notice(url)}
<form method="get" action="/console/applications" class="row"><div><label for="status">Status</label><select id="status" name="status"><option value="">all</option>${ApplicationStatus.literals.map(
        (s) => h`<option value="${s}"${filter === s ? h` selected` : ""}>${s}</option>`,
      )}</select></div><button type="submit" class="secondary">Filter</button></form>
<table><caption class="sr">Applications, newest first</caption><thead><tr><th scope="col">Id</th><th scope="col">Applicant</th><th scope="col">Organization</th><th scope="col">Use</th><th scope="col">Status</th><th scope="col">Applied</th><th scope="col">Decision</th></tr></thead>
<tbody>${list.data.length === 0 ? h`<tr><td colspan="7">No applications.</td></tr>` : list.data.map((a) => applicationRow(a, session))}</tbody></table>`,
      nav("applications", session),
    )
  })

const accountsPage = (url: URL, session: ConsoleSession.Session) =>
  Effect.gen(function* () {
    const { data } = yield* Admin.listAccounts()
    return page(
      "Accounts",
      h`<h1>Accounts</h1>${notice(url)}
<table><thead><tr><th scope="col">Account</th><th scope="col">Status</th><th scope="col">Email</th><th scope="col">Balance</th><th scope="col">Held</th><th scope="col">Spent this month</th><th scope="col">Monthly limit</th><th scope="col">Limits</th></tr></thead>
<tbody>${
        data.length === 0
          ? h`<tr><td colspan="8">No accounts.</td></tr>`
          : [...data].reverse().map(
              (a) =>
                h`<tr><td><a href="/console/accounts/${a.id}">${a.name}</a><br><small><code>${a.id}</code></small></td><td>${a.status}</td><td>${a.email ?? "—"}${a.email !== null && !a.email_verified ? " (unverified)" : ""}</td><td class="num">${usd(a.balance_usd)}</td><td class="num">${usd(a.held_usd)}</td><td class="num">${usd(a.spent_month_usd)}</td><td class="num">${usd(a.monthly_spend_limit_usd)}</td><td>${
                  Object.entries(a.limits)
                    .filter(([, v]) => v !== null)
                    .map(([k, v]) => `${k} ${v}`)
                    .join(", ") || "defaults"
                }</td></tr>`,
            )
      }</tbody></table>`,
      nav("accounts", session),
    )
  })

const accountPage = (id: string, url: URL, session: ConsoleSession.Session, created?: Admin.CreatedKeyView) =>
  Effect.gen(function* () {
    const account = yield* Admin.getAccount(id)
    const keys = yield* Admin.listKeys(id)
    const open = account.status !== "closing" && account.status !== "closed"
    return page(
      account.name,
      h`<h1>${account.name} <small><code>${account.id}</code></small></h1>${notice(url)}
${
  created === undefined
    ? ""
    : h`<div class="note" role="status"><p><strong>New key &mdash; copy it now, it is shown this once:</strong></p><p class="secret"><output id="new-key">${created.key}</output></p></div>`
}
<table><tbody>
<tr><th scope="row">Status</th><td id="account-status">${account.status}${account.closed_at === null ? "" : ` (closed ${when(account.closed_at)})`}</td></tr>
<tr><th scope="row">Email</th><td>${account.email ?? "—"}${account.email !== null && !account.email_verified ? " (unverified)" : ""}</td></tr>
<tr><th scope="row">Balance</th><td>${usd(account.balance_usd)} (held ${usd(account.held_usd)})</td></tr>
<tr><th scope="row">Spent this month</th><td>${usd(account.spent_month_usd)} of ${usd(account.monthly_spend_limit_usd)}</td></tr>
<tr><th scope="row">Limits</th><td>${Object.entries(account.limits)
        .map(([k, v]) => `${k}: ${v ?? "default"}`)
        .join(", ")}</td></tr>
${"usage_now" in account && account.usage_now !== undefined ? h`<tr><th scope="row">Running now</th><td>${account.usage_now.concurrency} running, ${account.usage_now.queued} queued</td></tr>` : ""}
</tbody></table>
${
  account.status === "closed"
    ? ""
    : h`<h2>Credits</h2><form method="post" action="/console/accounts/${id}/credits" class="row">${csrfField(session)}<div><label for="amount">Add credit (USD)</label><input type="number" step="any" min="0" id="amount" name="amount_usd" required></div><button type="submit">Add credit</button></form>`
}
<h2>Keys</h2>
<table><thead><tr><th scope="col">Key</th><th scope="col">Name</th><th scope="col">Status</th><th scope="col">Spent</th><th scope="col">Created</th><th scope="col">Actions</th></tr></thead>
<tbody>${
        keys.data.length === 0
          ? h`<tr><td colspan="6">No keys.</td></tr>`
          : keys.data.map(
              (k) =>
                h`<tr data-key="${k.id}"><td><code>${k.prefix}&hellip;</code><br><small><code>${k.id}</code></small></td><td>${k.name ?? "—"}</td><td class="key-status">${k.status}</td><td class="num">${usd(k.spent_usd)}</td><td>${when(k.created)}</td><td>${
                  k.status === "revoked"
                    ? ""
                    : h`<form method="post" action="/console/keys/${k.id}/disable" class="inline">${csrfField(session)}<input type="hidden" name="disabled" value="${k.status === "disabled" ? "false" : "true"}"><input type="hidden" name="account" value="${id}"><button type="submit" class="secondary">${k.status === "disabled" ? "Enable" : "Disable"}</button></form>
<form method="post" action="/console/keys/${k.id}/revoke" class="inline">${csrfField(session)}<input type="hidden" name="account" value="${id}"><button type="submit" class="danger">Revoke</button></form>`
                }</td></tr>`,
            )
      }</tbody></table>
${
  open
    ? h`<form method="post" action="/console/accounts/${id}/keys" class="row">${csrfField(session)}<div><label for="key-name">New key name</label><input type="text" id="key-name" name="name" maxlength="200"></div><button type="submit">Create key</button></form>
<h2>Close the account</h2><p>New requests are refused at once; running ones finish and are charged; then every key is revoked and the final statement is mailed. This cannot be undone.</p>
<form method="post" action="/console/accounts/${id}/close">${csrfField(session)}<button type="submit" class="danger">Close account</button></form>`
    : ""
}`,
      nav("accounts", session),
    )
  })

interface DayRow {
  readonly day: number | string
  readonly requests: number | string
  readonly tokens: number | string | null
  readonly spend: number | string | null
}

interface ModelRow {
  readonly model: string
  readonly requests: number | string
  readonly tokens: number | string | null
  readonly spend: number | string | null
}

const usagePage = (url: URL, session: ConsoleSession.Session) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const now = yield* Clock.currentTimeMillis
    const firstDay = Math.floor(now / DAY) - (USAGE_DAYS - 1)
    const since = firstDay * DAY
    // The day number in SQL; CAST keeps it whole where a bound number divides as a real (SQLite).
    const days = yield* sql<DayRow>`SELECT CAST(created_at / ${DAY} AS BIGINT) AS day, COUNT(*) AS requests,
        SUM(prompt_tokens + completion_tokens) AS tokens, SUM(cost_micros) AS spend
      FROM usage_records WHERE created_at >= ${since} GROUP BY CAST(created_at / ${DAY} AS BIGINT) ORDER BY day`
    const models = yield* sql<ModelRow>`SELECT model, COUNT(*) AS requests,
        SUM(prompt_tokens + completion_tokens) AS tokens, SUM(cost_micros) AS spend
      FROM usage_records WHERE created_at >= ${since} GROUP BY model ORDER BY model`
    const n = (v: number | string | null) => (v === null ? 0 : Database.toNumber(v))
    const byDay = new Map(days.map((d) => [n(d.day), d]))
    const series = Array.from({ length: USAGE_DAYS }, (_, i) => {
      const day = firstDay + i
      const row = byDay.get(day)
      return {
        label: new Date(day * DAY).toISOString().slice(5, 10),
        requests: row === undefined ? 0 : n(row.requests),
        tokens: row === undefined ? 0 : n(row.tokens),
        spend: row === undefined ? 0 : n(row.spend) / 1e6,
      }
    })
    const dailyChart = (
      id: string,
      title: string,
      key: "requests" | "tokens" | "spend",
      format: (x: number) => string,
    ) =>
      h`<section class="row" style="align-items:start"><div style="flex:2;min-width:20rem">${barChart(
        id,
        title,
        series.map((s) => ({ label: s.label, value: s[key] })),
        format,
      )}</div></section>`
    const count = (x: number) => x.toLocaleString("en-US")
    return page(
      "Usage",
      h`<h1>Usage, last ${USAGE_DAYS} days (UTC)</h1>
${dailyChart("chart-requests", "Requests per day", "requests", count)}
${dailyChart("chart-tokens", "Tokens per day", "tokens", count)}
${dailyChart("chart-spend", "Spend per day (USD)", "spend", (x) => usd(x))}
<h2>Per day</h2>
<table id="usage-days"><thead><tr><th scope="col">Day</th><th scope="col">Requests</th><th scope="col">Tokens</th><th scope="col">Spend</th></tr></thead>
<tbody>${series.map((s) => h`<tr><td>${s.label}</td><td class="num">${count(s.requests)}</td><td class="num">${count(s.tokens)}</td><td class="num">${usd(s.spend)}</td></tr>`)}</tbody></table>
<h2>Per model</h2>
${barChart(
  "chart-models",
  "Requests per model",
  models.map((m) => ({ label: m.model, value: n(m.requests) })),
  count,
)}
<table id="usage-models"><thead><tr><th scope="col">Model</th><th scope="col">Requests</th><th scope="col">Tokens</th><th scope="col">Spend</th></tr></thead>
<tbody>${
        models.length === 0
          ? h`<tr><td colspan="4">No requests in this period.</td></tr>`
          : models.map(
              (m) =>
                h`<tr><td>${m.model}</td><td class="num">${count(n(m.requests))}</td><td class="num">${count(n(m.tokens))}</td><td class="num">${usd(n(m.spend) / 1e6)}</td></tr>`,
            )
      }</tbody></table>${notice(url)}`,
      nav("usage", session),
    )
  }).pipe(Effect.catchTag("SqlError", () => Effect.fail(Admin.storeUnavailable)))

const NODE_COLUMNS = [
  "id",
  "state",
  "circuit",
  "in_flight",
  "capacity",
  "error_rate",
  "ttft_ms",
  "reputation",
  "models",
] as const

const nodesPage = (session: ConsoleSession.Session) =>
  Effect.gen(function* () {
    const nodes = (yield* (yield* Dispatcher.Dispatcher).status).map(AdminNodes.nodeView)
    return page(
      "Nodes",
      h`<h1>Nodes</h1><p>Refreshes every 2 seconds (<span id="nodes-updated">${new Date().toISOString()}</span>). Without JavaScript, reload the page.</p>
<table id="nodes"><thead><tr>${NODE_COLUMNS.map((c) => h`<th scope="col">${c.replace("_", " ")}</th>`)}</tr></thead>
<tbody>${nodes.map((node) => h`<tr>${NODE_COLUMNS.map((c) => h`<td>${Array.isArray(node[c]) ? (node[c] as ReadonlyArray<string>).join(", ") : String(node[c] ?? "—")}</td>`)}</tr>`)}</tbody></table>
<script src="/console/assets/nodes.js" defer></script>`,
      nav("nodes", session),
    )
  })

/** Rebuilds the nodes table from `/console/nodes.json` every 2 s (text only: no HTML from data). */
const NODES_SCRIPT = `"use strict";
const columns = ${JSON.stringify(NODE_COLUMNS)};
async function refresh() {
  try {
    const response = await fetch("/console/nodes.json", { credentials: "same-origin" });
    if (!response.ok) return;
    const { data } = await response.json();
    const body = document.querySelector("#nodes tbody");
    body.replaceChildren(...data.map((node) => {
      const row = document.createElement("tr");
      for (const c of columns) {
        const cell = document.createElement("td");
        const value = node[c];
        cell.textContent = Array.isArray(value) ? value.join(", ") : value === null || value === undefined ? "—" : String(value);
        row.append(cell);
      }
      return row;
    }));
    document.getElementById("nodes-updated").textContent = new Date().toISOString();
  } catch {}
}
setInterval(refresh, 2000);
`

// --- handling ------------------------------------------------------------------------------

const errorPage = (error: AdminError, back: string, session: ConsoleSession.Session) =>
  page(
    "Not done",
    h`<h1>Not done</h1><p class="error" role="alert">${error.message}</p><p><a href="${back}">Back</a></p>`,
    nav("", session),
  )

const readForm = (req: IncomingMessage, startedAt: number) =>
  Effect.gen(function* () {
    const config = yield* GatewayConfig.GatewayConfig
    const buffer = yield* HttpIo.readBody(req, { ...config, maxBodyBytes: MAX_FORM_BYTES }, startedAt)
    return new URLSearchParams(buffer.toString("utf8"))
  })

/** Form text to the JSON the admin API's schemas judge: empty is absent, numbers are numbers. */
const numberField = (form: URLSearchParams, name: string): unknown => {
  const value = form.get(name)?.trim()
  if (value === undefined || value === "") return undefined
  const n = Number(value)
  return Number.isFinite(n) ? n : value
}

const defined = (entries: ReadonlyArray<readonly [string, unknown]>) =>
  Object.fromEntries(entries.filter(([, v]) => v !== undefined))

/** Same-origin check: a browser sends Origin with every form post; a foreign one is refused. */
const foreignOrigin = (req: IncomingMessage) => {
  const origin = req.headers.origin
  if (origin === undefined || origin === "null") return origin === "null"
  try {
    return new URL(origin).host !== req.headers.host
  } catch {
    return true
  }
}

const forbidden = (res: ServerResponse) =>
  sendHtml(
    res,
    403,
    page(
      "Refused",
      h`<h1>Refused</h1><p class="error" role="alert">The form was not accepted: it did not carry this session's CSRF token. Reload the page and try again.</p>`,
    ),
  )

/** What a change did: a notice shown on the page it goes back to, or a page to show now. */
type Done = { readonly notice: string; readonly back?: string | undefined } | Raw

type Action = (form: URLSearchParams) => Effect.Effect<Done, AdminError, ConsoleServices>

/** A change: session, origin and CSRF token checked, then the action; success goes back with a notice. */
const change = (
  req: IncomingMessage,
  res: ServerResponse,
  session: ConsoleSession.Session,
  startedAt: number,
  back: string,
  action: Action,
) =>
  Effect.gen(function* () {
    if (foreignOrigin(req)) return forbidden(res)
    const form = yield* readForm(req, startedAt)
    const sent = form.get("csrf") ?? ""
    if (!ConsoleSession.sameSecret(sent, session.csrf)) return forbidden(res)
    const outcome = yield* Effect.either(action(form))
    if (outcome._tag === "Left")
      return sendHtml(res, outcome.left.status, errorPage(outcome.left, back, session))
    const done = outcome.right
    if (done instanceof Raw) return sendHtml(res, 200, done.html)
    return redirect(res, `${done.back ?? back}?notice=${encodeURIComponent(done.notice)}`)
  })

/** Answers every path under `/console`. */
export const handle = (
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  startedAt: number,
): Effect.Effect<void, unknown, ConsoleServices> =>
  Effect.gen(function* () {
    const gateway = yield* GatewayConfig.GatewayConfig
    if (Option.isNone(gateway.adminToken)) return HttpIo.empty(res, 404)
    const adminToken = Redacted.value(gateway.adminToken.value)
    const config = yield* AdminConfig
    const secure = ConsoleSession.isHttps(req, config.publicUrl())
    const url = new URL(req.url ?? "/", "http://console")
    const method = req.method ?? "GET"
    const segments = HttpIo.segmentsAfter(CONSOLE_PREFIX, path)
    const [first, id, action, ...rest] = segments
    const get = method === "GET" || method === "HEAD"

    if (first === "assets" && id === "nodes.js" && action === undefined && get) {
      res.writeHead(200, {
        "content-type": "text/javascript; charset=utf-8",
        "cache-control": "no-store",
        "x-content-type-options": "nosniff",
      })
      return res.end(NODES_SCRIPT)
    }
    if (first === "login" && id === undefined) {
      if (get) return sendHtml(res, 200, loginPage())
      if (method !== "POST") return HttpIo.empty(res, 405, "GET, POST")
      if (foreignOrigin(req)) return forbidden(res)
      const form = yield* readForm(req, startedAt)
      if (!ConsoleSession.sameSecret(form.get("token") ?? "", adminToken))
        return sendHtml(res, 401, loginPage("That is not the admin token."))
      const sessionId = yield* ConsoleSession.open
      return redirect(res, "/console/applications", {
        "set-cookie": ConsoleSession.setCookie(sessionId, secure),
      })
    }

    const session = yield* ConsoleSession.find(req)
    if (session === undefined) {
      if (get) return redirect(res, "/console/login")
      HttpIo.closeAfterUnreadBody(req, res)
      return forbidden(res)
    }
    if (first === "logout" && id === undefined) {
      if (method !== "POST") return HttpIo.empty(res, 405, "POST")
      if (foreignOrigin(req)) return forbidden(res)
      const form = yield* readForm(req, startedAt)
      if (!ConsoleSession.sameSecret(form.get("csrf") ?? "", session.csrf)) return forbidden(res)
      yield* ConsoleSession.close(session)
      return redirect(res, "/console/login", { "set-cookie": ConsoleSession.clearCookie(secure) })
    }
    if (rest.length > 0) return HttpIo.empty(res, 404)

    const show = (html: Effect.Effect<string, AdminError, ConsoleServices>) =>
      Effect.matchEffect(html, {
        onSuccess: (text) => Effect.sync(() => sendHtml(res, 200, text)),
        onFailure: (error) =>
          Effect.sync(() => sendHtml(res, error.status, errorPage(error, "/console", session))),
      })

    if (get) {
      if (first === undefined) return redirect(res, "/console/applications")
      if (id === undefined) {
        if (first === "applications") return yield* show(applicationsPage(url, session))
        if (first === "accounts") return yield* show(accountsPage(url, session))
        if (first === "usage") return yield* show(usagePage(url, session))
        if (first === "nodes") return yield* show(nodesPage(session))
        if (first === "nodes.json") {
          const nodes = yield* (yield* Dispatcher.Dispatcher).status
          return HttpIo.sendJson(res, 200, { data: nodes.map(AdminNodes.nodeView) })
        }
      }
      if (first === "accounts" && id !== undefined && action === undefined)
        return yield* show(accountPage(id, url, session))
      return HttpIo.empty(res, 404)
    }
    if (method !== "POST") return HttpIo.empty(res, 405, "GET, POST")

    const go = (back: string, act: Action) => change(req, res, session, startedAt, back, act)
    if (first === "applications" && id !== undefined && action === "approve")
      return yield* go("/console/applications", (form) =>
        Effect.map(
          Admin.approveApplication(
            id,
            defined([
              ["balance_usd", numberField(form, "balance_usd")],
              [
                "limits",
                ((limits) => (Object.keys(limits).length === 0 ? undefined : limits))(
                  defined([
                    ["concurrency", numberField(form, "concurrency")],
                    ["rpm", numberField(form, "rpm")],
                  ]),
                ),
              ],
            ]),
          ),
          (app) => ({
            notice: `Approved ${app.name}: account ${app.account_id} created and the claim link mailed.`,
          }),
        ),
      )
    if (first === "applications" && id !== undefined && action === "reject")
      return yield* go("/console/applications", (form) =>
        Effect.map(Admin.rejectApplication(id, { reason: form.get("reason") ?? "" }), (app) => ({
          notice: `Rejected ${app.name}.`,
        })),
      )
    if (first === "accounts" && id !== undefined && action === "credits")
      return yield* go(`/console/accounts/${encodeURIComponent(id)}`, (form) =>
        Effect.map(Admin.creditAccount(id, { amount_usd: numberField(form, "amount_usd") }), (a) => ({
          notice: `Credit added: balance ${usd(a.balance_usd)}.`,
        })),
      )
    if (first === "accounts" && id !== undefined && action === "close")
      return yield* go(`/console/accounts/${encodeURIComponent(id)}`, () =>
        Effect.map(Admin.closeAccount(id), (a) => ({ notice: `The account is ${a.status}.` })),
      )
    if (first === "accounts" && id !== undefined && action === "keys")
      return yield* go(`/console/accounts/${encodeURIComponent(id)}`, (form) =>
        Effect.flatMap(
          Admin.createKey(id, defined([["name", form.get("name")?.trim() || undefined]])),
          (created) => Effect.map(accountPage(id, url, session, created), raw),
        ),
      )
    if (first === "keys" && id !== undefined && (action === "revoke" || action === "disable"))
      return yield* go("/console/accounts", (form) => {
        const account = form.get("account")
        const backTo = account === null ? undefined : `/console/accounts/${encodeURIComponent(account)}`
        return action === "revoke"
          ? Effect.map(Admin.revokeKey(id), (k) => ({ notice: `Key ${k.prefix}… revoked.`, back: backTo }))
          : Effect.map(Admin.updateKey(id, { disabled: form.get("disabled") === "true" }), (k) => ({
              notice: `Key ${k.prefix}… is ${k.status}.`,
              back: backTo,
            }))
      })
    return HttpIo.empty(res, 404)
  })
