/**
 * The mail the service sends. Each has a plain-text part with its links as
 * absolute URLs (readable in any client, and in the outbox) and a small HTML
 * part with the same words.
 */
import { escapeHtml } from "./Html"
import type { Mail } from "./Mail"

interface Link {
  readonly url: string
  readonly label: string
}

const html = (paragraphs: ReadonlyArray<string>, link?: Link) =>
  [
    '<!doctype html><html><body style="font-family:sans-serif;max-width:36em">',
    ...paragraphs.map((p) => `<p>${escapeHtml(p)}</p>`),
    link === undefined ? "" : `<p><a href="${escapeHtml(link.url)}">${escapeHtml(link.label)}</a></p>`,
    "</body></html>",
  ].join("\n")

/** One mail from its paragraphs: the link (if any) after them, then the closing paragraphs. */
const compose = (
  to: string,
  subject: string,
  lines: ReadonlyArray<string>,
  link?: Link,
  after: ReadonlyArray<string> = [],
): Mail => ({
  to,
  subject,
  text: `${[...lines, ...(link === undefined ? [] : [link.url]), ...after].join("\n\n")}\n`,
  html: html([...lines, ...after], link),
})

export const verifyApplication = (to: string, name: string, url: string): Mail =>
  compose(
    to,
    "Confirm your email address for swarmgate",
    [
      `Hello ${name},`,
      "thank you for applying for access to swarmgate. Please confirm your email address by opening this link within 24 hours:",
    ],
    { url, label: "Confirm my address" },
    ["If you did not apply, ignore this mail."],
  )

export const approved = (to: string, name: string, url: string): Mail =>
  compose(
    to,
    "Your swarmgate API key is ready",
    [
      `Hello ${name},`,
      "your application for swarmgate was approved. Your API key is waiting for you: open this link within 7 days to see it. The link works once.",
    ],
    { url, label: "Show my API key" },
  )

export const rejected = (to: string, name: string, reason: string): Mail =>
  compose(to, "Your swarmgate application", [
    `Hello ${name},`,
    "your application for swarmgate was not approved.",
    `Reason: ${reason}`,
  ])

export const verifyAddress = (to: string, name: string, url: string): Mail =>
  compose(
    to,
    "Confirm the new email address of your swarmgate account",
    [
      `Hello ${name},`,
      "this address was set for your swarmgate account. Until you confirm it, the account's API keys are refused (403 account_restricted). Open this link within 24 hours to confirm it:",
    ],
    { url, label: "Confirm this address" },
  )

export interface StatementLines {
  readonly accountId: string
  readonly creditsUsd: number
  readonly chargesUsd: number
  readonly refundsUsd: number
  readonly balanceUsd: number
  readonly closedAt: string
}

const usd = (n: number) => `${n.toFixed(6)} USD`

export const statement = (to: string, name: string, s: StatementLines): Mail =>
  compose(to, "Your swarmgate account is closed", [
    `Hello ${name},`,
    `your swarmgate account ${s.accountId} was closed on ${s.closedAt}; its API keys no longer work. Final statement:`,
    `Credits: ${usd(s.creditsUsd)}\nCharges: ${usd(s.chargesUsd)}\nRefunds: ${usd(s.refundsUsd)}\nBalance: ${usd(s.balanceUsd)}`,
  ])
