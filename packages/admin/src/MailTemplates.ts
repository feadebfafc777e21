/**
 * The mail the service sends. Each has a plain-text part with its links as
 * absolute URLs (readable in any client, and in the outbox) and a small HTML
 * part with the same words.
 */
import { escapeHtml } from "./Html"
import type { Mail } from "./Mail"

const html = (paragraphs: ReadonlyArray<string>, link?: { readonly url: string; readonly label: string }) =>
  [
    '<!doctype html><html><body style="font-family:sans-serif;max-width:36em">',
    ...paragraphs.map((p) => `<p>${escapeHtml(p)}</p>`),
    link === undefined ? "" : `<p><a href="${escapeHtml(link.url)}">${escapeHtml(link.label)}</a></p>`,
    "</body></html>",
  ].join("\n")

export const verifyApplication = (to: string, name: string, url: string): Mail => {
  const lines = [
    `Hello ${name},`,
    "thank you for applying for access to swarmgate. Please confirm your email address by opening this link within 24 hours:",
  ]
  return {
    to,
    subject: "Confirm your email address for swarmgate",
    text: `${lines.join("\n\n")}\n\n${url}\n\nIf you did not apply, ignore this mail.\n`,
    html: html([...lines, "If you did not apply, ignore this mail."], { url, label: "Confirm my address" }),
  }
}

export const approved = (to: string, name: string, url: string): Mail => {
  const lines = [
    `Hello ${name},`,
    "your application for swarmgate was approved. Your API key is waiting for you: open this link within 7 days to see it. The link works once.",
  ]
  return {
    to,
    subject: "Your swarmgate API key is ready",
    text: `${lines.join("\n\n")}\n\n${url}\n`,
    html: html(lines, { url, label: "Show my API key" }),
  }
}

export const rejected = (to: string, name: string, reason: string): Mail => {
  const lines = [`Hello ${name},`, "your application for swarmgate was not approved.", `Reason: ${reason}`]
  return { to, subject: "Your swarmgate application", text: `${lines.join("\n\n")}\n`, html: html(lines) }
}

export const verifyAddress = (to: string, name: string, url: string): Mail => {
  const lines = [
    `Hello ${name},`,
    "this address was set for your swarmgate account. Until you confirm it, the account's API keys are refused (403 account_restricted). Open this link within 24 hours to confirm it:",
  ]
  return {
    to,
    subject: "Confirm the new email address of your swarmgate account",
    text: `${lines.join("\n\n")}\n\n${url}\n`,
    html: html(lines, { url, label: "Confirm this address" }),
  }
}

export interface StatementLines {
  readonly accountId: string
  readonly creditsUsd: number
  readonly chargesUsd: number
  readonly refundsUsd: number
  readonly balanceUsd: number
  readonly closedAt: string
}

const usd = (n: number) => `${n.toFixed(6)} USD`

export const statement = (to: string, name: string, s: StatementLines): Mail => {
  const lines = [
    `Hello ${name},`,
    `your swarmgate account ${s.accountId} was closed on ${s.closedAt}; its API keys no longer work. Final statement:`,
    `Credits: ${usd(s.creditsUsd)}\nCharges: ${usd(s.chargesUsd)}\nRefunds: ${usd(s.refundsUsd)}\nBalance: ${usd(s.balanceUsd)}`,
  ]
  return {
    to,
    subject: "Your swarmgate account is closed",
    text: `${lines.join("\n\n")}\n`,
    html: html(lines),
  }
}
