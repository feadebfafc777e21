/**
 * Server-rendered HTML for the public pages and the console: escaping, one
 * page frame, and the answer with its security headers.
 */
import type { ServerResponse } from "node:http"

const ESCAPES: Readonly<Record<string, string>> = {
  "&": "&amp;",
  "<": "&lt;",
  ">": "&gt;",
  '"': "&quot;",
  "'": "&#39;",
}

export const escapeHtml = (text: string): string => text.replace(/[&<>"']/g, (c) => ESCAPES[c] ?? c)

/** Tagged template: interpolated values are escaped unless they are `Raw` (already HTML). */
export class Raw {
  constructor(readonly html: string) {}
}

export const raw = (html: string) => new Raw(html)

const part = (value: unknown): string =>
  value instanceof Raw
    ? value.html
    : Array.isArray(value)
      ? value.map(part).join("")
      : value === undefined || value === null || value === false
        ? ""
        : escapeHtml(String(value))

export const h = (strings: TemplateStringsArray, ...values: ReadonlyArray<unknown>): Raw => {
  let out = strings[0] ?? ""
  for (let i = 0; i < values.length; i++) out += part(values[i]) + (strings[i + 1] ?? "")
  return new Raw(out)
}

const STYLE = `
body{font-family:system-ui,sans-serif;margin:0;color:#1a1a1a;background:#fafafa;line-height:1.45}
main{max-width:62rem;margin:0 auto;padding:1.5rem}
header.bar{background:#1f2937;color:#fff;padding:.6rem 1.5rem;display:flex;gap:1.2rem;align-items:center;flex-wrap:wrap}
header.bar a{color:#e5e7eb;text-decoration:none}header.bar a[aria-current=page]{color:#fff;font-weight:600;text-decoration:underline}
header.bar form{margin-left:auto}
label{display:block;margin:.8rem 0 .2rem;font-weight:600}
input[type=text],input[type=email],input[type=password],input[type=number],textarea,select{width:100%;max-width:32rem;padding:.45rem;border:1px solid #9ca3af;border-radius:4px;font:inherit}
textarea{min-height:7rem}
button{padding:.45rem .9rem;border-radius:4px;border:1px solid #1f2937;background:#1f2937;color:#fff;font:inherit;cursor:pointer}
button.secondary{background:#fff;color:#1f2937}button.danger{background:#b91c1c;border-color:#b91c1c}
:focus-visible{outline:3px solid #2563eb;outline-offset:2px}
table{border-collapse:collapse;width:100%;margin:.8rem 0;background:#fff}th,td{border:1px solid #e5e7eb;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f4f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
.error{color:#b91c1c}.note{background:#eef2ff;border:1px solid #c7d2fe;padding:.6rem;border-radius:4px}
.secret{font-family:ui-monospace,monospace;background:#fff;border:1px solid #d1d5db;padding:.5rem;word-break:break-all}
pre{background:#111827;color:#f9fafb;padding:.8rem;overflow:auto;border-radius:4px}
.sr{position:absolute;left:-9999px}.inline{display:inline}.row{display:flex;gap:.6rem;flex-wrap:wrap;align-items:end}
`

export const page = (title: string, body: Raw, nav?: Raw): string =>
  `<!doctype html>\n${
    h`<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · swarmgate</title><style>${raw(STYLE)}</style></head>
<body>${nav ?? ""}<main>${body}</main></body></html>`.html
  }`

/** An HTML answer that is never cached or framed, and runs no script but our own. */
export const sendHtml = (
  res: ServerResponse,
  status: number,
  html: string,
  headers: Readonly<Record<string, string | ReadonlyArray<string>>> = {},
) => {
  res.writeHead(status, {
    "content-type": "text/html; charset=utf-8",
    "content-length": String(Buffer.byteLength(html)),
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "content-security-policy":
      "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
    ...headers,
  })
  res.end(html)
}

export const redirect = (
  res: ServerResponse,
  location: string,
  headers: Readonly<Record<string, string | ReadonlyArray<string>>> = {},
) => {
  res.writeHead(303, { location, "content-length": "0", "cache-control": "no-store", ...headers })
  res.end()
}
