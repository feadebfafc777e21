/**
 * Settings of the admin side that the gateway does not need: where links in
 * mail point, how mail goes out, how often one client may apply.
 */
import { Config, Context, Layer, Option, Redacted } from "effect"

export interface AdminConfigShape {
  /**
   * The base of every link in a mail, without a trailing slash:
   * `SWARMGATE_PUBLIC_URL`, else `http://HOST:PORT` of the listening server.
   */
  readonly publicUrl: () => string
  /** Called once the server listens (the port may have been 0); sets the default base. */
  readonly listening: (host: string, port: number) => void
  /** `SWARMGATE_SMTP_URL`; without it mail is kept in the outbox. */
  readonly smtpUrl: Option.Option<Redacted.Redacted>
  readonly mailFrom: string
  /** Accepted applications per client IP per hour (`SWARMGATE_APPLY_PER_HOUR`). */
  readonly applyPerHour: number
}

export class AdminConfig extends Context.Tag("@swarmgate/admin/AdminConfig")<
  AdminConfig,
  AdminConfigShape
>() {}

export const DEFAULT_APPLY_PER_HOUR = 10

const trimSlash = (url: string) => url.replace(/\/+$/, "")

/** A wildcard address is no place to send a browser: links say localhost instead. */
const linkHost = (host: string) =>
  host === "0.0.0.0" || host === "::" || host === "" ? "localhost" : host.includes(":") ? `[${host}]` : host

/** `explicit` wins; else the listening address once known, `fallback` before. */
export const publicUrlOf = (explicit: string | undefined, fallback: string) => {
  let listeningAt = fallback
  return {
    publicUrl: () => (explicit !== undefined ? trimSlash(explicit) : listeningAt),
    listening: (host: string, port: number) => {
      listeningAt = `http://${linkHost(host)}:${port}`
    },
  }
}

export const MAIL_FROM_DEFAULT = "swarmgate <no-reply@localhost>"

export const defaults = (publicUrl: string): AdminConfigShape => ({
  ...publicUrlOf(publicUrl, publicUrl),
  smtpUrl: Option.none(),
  mailFrom: MAIL_FROM_DEFAULT,
  applyPerHour: DEFAULT_APPLY_PER_HOUR,
})

/** From the environment; `fallback` is the base until the server listens. */
export const config = (fallback: string) =>
  Config.all({
    publicUrl: Config.string("SWARMGATE_PUBLIC_URL").pipe(
      Config.validate({
        message: "SWARMGATE_PUBLIC_URL must be an http(s) URL",
        validation: (url) => url.trim() === "" || /^https?:\/\/[^\s]+$/.test(url.trim()),
      }),
      Config.withDefault(""),
    ),
    smtpUrl: Config.option(Config.redacted("SWARMGATE_SMTP_URL")),
    mailFrom: Config.string("SWARMGATE_MAIL_FROM").pipe(Config.withDefault(MAIL_FROM_DEFAULT)),
    applyPerHour: Config.integer("SWARMGATE_APPLY_PER_HOUR").pipe(
      Config.validate({ message: "SWARMGATE_APPLY_PER_HOUR must be at least 0", validation: (n) => n >= 0 }),
      Config.withDefault(DEFAULT_APPLY_PER_HOUR),
    ),
  }).pipe(
    Config.map(
      (c): AdminConfigShape => ({
        ...publicUrlOf(c.publicUrl.trim() === "" ? undefined : c.publicUrl.trim(), fallback),
        mailFrom: c.mailFrom,
        applyPerHour: c.applyPerHour,
        smtpUrl: Option.filter(c.smtpUrl, (url) => Redacted.value(url).trim().length > 0),
      }),
    ),
  )

export const layer = (shape: AdminConfigShape) => Layer.succeed(AdminConfig, shape)

export const layerFromEnv = (fallback: string) => Layer.effect(AdminConfig, config(fallback))
