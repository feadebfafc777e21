/**
 * The pages an applicant sees, outside `/v1` and without a key: the
 * application form (`/apply`, works without JavaScript), the page after it,
 * and the three mailed links (`/apply/verify`, `/apply/claim`,
 * `/account/verify`). `POST /apply` takes JSON or a form post and answers
 * each in kind; JSON refusals are the §7 shapes (422 `detail`, 429 with
 * `Retry-After`).
 */
import type { IncomingMessage, ServerResponse } from "node:http"
import { GatewayConfig, HttpIo } from "@swarmgate/gateway"
import {
  type ApiError,
  REQUEST_ID_HEADER,
  UnsupportedMediaType,
  type ValidationDetail,
} from "@swarmgate/protocol"
import { Effect } from "effect"
import * as AccountLifecycle from "./AccountLifecycle"
import type { AdminServices } from "./Admin"
import { AdminConfig } from "./AdminConfig"
import * as Applications from "./Applications"
import { h, page, raw, redirect, sendHtml } from "./Html"
import type { LinkRefused } from "./OneTimeLinks"

/** Far above any honest application; the form's own limits are smaller still. */
export const MAX_APPLY_BODY_BYTES = 64 * 1024

const FORM_FIELDS = ["name", "email", "organization", "use_case"] as const

export const PUBLIC_PATHS: Readonly<Record<string, ReadonlyArray<string>>> = {
  "/apply": ["GET", "POST"],
  "/apply/sent": ["GET"],
  "/apply/verify": ["GET"],
  "/apply/claim": ["GET"],
  "/account/verify": ["GET"],
}

/** The client an hourly bound counts: the peer, or the address a proxy on this machine names. */
export const clientOf = (req: IncomingMessage): string => {
  const peer = req.socket.remoteAddress ?? "unknown"
  const loopback = peer === "127.0.0.1" || peer === "::1" || peer === "::ffff:127.0.0.1"
  const forwarded = req.headers["x-forwarded-for"]
  if (!loopback || typeof forwarded !== "string") return peer
  const last = forwarded.split(",").at(-1)?.trim()
  return last !== undefined && last.length > 0 && last.length <= 64 ? last : peer
}

// --- pages ---------------------------------------------------------------------------

const fieldLabel: Record<(typeof FORM_FIELDS)[number], string> = {
  name: "Your name",
  email: "Email address",
  organization: "Organization (optional)",
  use_case: "What will you use the API for?",
}

const formPage = (values: Record<string, string>, problems: ReadonlyArray<ValidationDetail>) => {
  const problemOf = (field: string) => problems.find((p) => p.loc[1] === field)?.msg
  const field = (name: (typeof FORM_FIELDS)[number], input: (attrs: ReturnType<typeof raw>) => unknown) => {
    const problem = problemOf(name)
    const attrs = raw(
      `id="${name}" name="${name}"${problem === undefined ? "" : ` aria-invalid="true" aria-describedby="${name}-error"`}`,
    )
    return h`<label for="${name}">${fieldLabel[name]}</label>${input(attrs)}${
      problem === undefined ? "" : h`<p class="error" id="${name}-error">${problem}</p>`
    }`
  }
  const summary =
    problems.length === 0
      ? ""
      : h`<div class="error" role="alert"><p>Please correct the fields marked below.</p></div>`
  return page(
    "Apply for access",
    h`<h1>Apply for API access</h1>
<p>Access to swarmgate is granted on application during the Preview. We mail you a link to confirm your address; after review you get a second mail with your API key.</p>
${summary}
<form method="post" action="/apply" novalidate>
${field("name", (a) => h`<input type="text" ${a} autocomplete="name" required maxlength="${Applications.MAX_NAME_LENGTH}" value="${values.name ?? ""}">`)}
${field("email", (a) => h`<input type="email" ${a} autocomplete="email" required maxlength="${Applications.MAX_EMAIL_LENGTH}" value="${values.email ?? ""}">`)}
${field("organization", (a) => h`<input type="text" ${a} autocomplete="organization" maxlength="${Applications.MAX_NAME_LENGTH}" value="${values.organization ?? ""}">`)}
${field("use_case", (a) => h`<textarea ${a} required maxlength="${Applications.MAX_USE_CASE_LENGTH}">${values.use_case ?? ""}</textarea>`)}
<p><button type="submit">Apply</button></p>
</form>`,
  )
}

const message = (title: string, ...paragraphs: ReadonlyArray<unknown>) =>
  page(title, h`<h1>${title}</h1>${paragraphs.map((p) => h`<p>${p}</p>`)}`)

const sentPage = message(
  "Check your mail",
  "We sent you a link to confirm your email address. It works once and for 24 hours.",
  "If the mail does not arrive, apply again with the same address: you get a new link (the old one stops working).",
)

const linkProblem = (error: LinkRefused, what: string) =>
  error.reason === "unknown"
    ? `This ${what} link is not valid. Check that you copied all of it.`
    : error.reason === "used"
      ? `This ${what} link was already used; each link works once.`
      : `This ${what} link has expired.`

const claimPage = (baseUrl: string, key: string) =>
  page(
    "Your API key",
    h`<h1>Your API key</h1>
<p class="note"><strong>Copy it now: it is shown this once.</strong> We store only a hash of it and cannot show it again.</p>
<p><label for="api-key">API key</label></p>
<p class="secret"><output id="api-key">${key}</output></p>
<p>Base URL: <code>${baseUrl}</code></p>
<h2>Try it with the official <code>openai</code> client</h2>
<pre>${`import OpenAI from "openai"

const client = new OpenAI({ baseURL: "${baseUrl}", apiKey: process.env.SWARMGATE_API_KEY })
const completion = await client.chat.completions.create({
  model: "swarm-prime",
  messages: [{ role: "user", content: "Say hello" }],
})
console.log(completion.choices[0].message.content)`}</pre>`,
  )

// --- handlers -----------------------------------------------------------------------

const requestIdOf = (res: ServerResponse) => String(res.getHeader(REQUEST_ID_HEADER) ?? "")

const sendError = (req: IncomingMessage, res: ServerResponse, error: ApiError) =>
  HttpIo.sendError(req, res, requestIdOf(res), error)

const isForm = (contentType: string | undefined) =>
  (contentType ?? "").split(";")[0]!.trim().toLowerCase() === "application/x-www-form-urlencoded"

const tokenOf = (req: IncomingMessage) => new URL(req.url ?? "/", "http://x").searchParams.get("token") ?? ""

const applyPost = (req: IncomingMessage, res: ServerResponse, startedAt: number) =>
  Effect.gen(function* () {
    const contentType = req.headers["content-type"]
    const form = isForm(contentType)
    if (!form && !HttpIo.isJsonContentType(contentType)) {
      return sendError(
        req,
        res,
        new UnsupportedMediaType({
          message: "Content-Type must be application/json or application/x-www-form-urlencoded.",
        }),
      )
    }
    const config = yield* GatewayConfig.GatewayConfig
    const buffer = yield* HttpIo.readBody(req, { ...config, maxBodyBytes: MAX_APPLY_BODY_BYTES }, startedAt)
    let body: unknown
    let values: Record<string, string> = {}
    if (form) {
      const params = new URLSearchParams(buffer.toString("utf8"))
      for (const name of FORM_FIELDS) {
        const value = params.get(name)
        if (value !== null) values[name] = value
      }
      body = values
    } else {
      body = yield* HttpIo.parseJson(buffer)
    }
    const outcome = yield* Effect.either(Applications.apply(body, clientOf(req)))
    if (outcome._tag === "Right") {
      if (form) return redirect(res, "/apply/sent")
      return HttpIo.sendJson(res, 202, outcome.right)
    }
    const error = outcome.left
    if (!form) return sendError(req, res, error)
    if (error._tag === "ValidationFailed") return sendHtml(res, 422, formPage(values, error.detail))
    values = {}
    const retry = error.retryAfter
    return sendHtml(
      res,
      error.status,
      message(error.status === 429 ? "Too many applications" : "Please try again", error.message),
      retry === undefined ? {} : { "retry-after": String(retry) },
    )
  })

const verifyApplication = (req: IncomingMessage, res: ServerResponse) =>
  Effect.matchEffect(Applications.verify(tokenOf(req)), {
    onSuccess: () =>
      Effect.sync(() =>
        sendHtml(
          res,
          200,
          message(
            "Address confirmed",
            "Thank you: your application is now waiting for review. We will mail you when it is decided.",
          ),
        ),
      ),
    onFailure: (error) =>
      Effect.sync(() =>
        error._tag === "LinkRefused"
          ? sendHtml(res, 400, message("Link not valid", linkProblem(error, "confirmation")))
          : sendHtml(res, error.status, message("Please try again", error.message)),
      ),
  })

const claimKey = (req: IncomingMessage, res: ServerResponse) =>
  Effect.gen(function* () {
    const config = yield* AdminConfig
    const outcome = yield* Effect.either(Applications.claim(tokenOf(req)))
    if (outcome._tag === "Right")
      return sendHtml(res, 200, claimPage(`${config.publicUrl()}/v1`, outcome.right.key))
    const error = outcome.left
    if (error._tag !== "LinkRefused")
      return sendHtml(res, error.status, message("Please try again", error.message))
    return sendHtml(
      res,
      error.reason === "unknown" ? 400 : 410,
      message(error.reason === "unknown" ? "Link not valid" : "Key already shown", linkProblem(error, "key")),
    )
  })

const verifyAddress = (req: IncomingMessage, res: ServerResponse) =>
  Effect.matchEffect(AccountLifecycle.verifyEmail(tokenOf(req)), {
    onSuccess: () =>
      Effect.sync(() =>
        sendHtml(res, 200, message("Address confirmed", "Thank you: your account's API keys work again.")),
      ),
    onFailure: (error) =>
      Effect.sync(() =>
        error._tag === "LinkRefused"
          ? sendHtml(res, 400, message("Link not valid", linkProblem(error, "confirmation")))
          : sendHtml(res, error.status, message("Please try again", error.message)),
      ),
  })

export type PublicServices = AdminServices | GatewayConfig.GatewayConfig

/** Answers a request on one of `PUBLIC_PATHS` with an allowed method. */
export const handle = (
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  startedAt: number,
): Effect.Effect<void, unknown, PublicServices> => {
  const method = req.method ?? "GET"
  switch (path) {
    case "/apply":
      return method === "POST"
        ? applyPost(req, res, startedAt)
        : Effect.sync(() => sendHtml(res, 200, formPage({}, [])))
    case "/apply/sent":
      return Effect.sync(() => sendHtml(res, 200, sentPage))
    case "/apply/verify":
      return verifyApplication(req, res)
    case "/apply/claim":
      return claimKey(req, res)
    default:
      return verifyAddress(req, res)
  }
}
