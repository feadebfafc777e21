/**
 * A real SMTP server (`smtp-server`) on 127.0.0.1 that keeps every message it
 * receives, for tests that follow mailed links as a user would.
 */
import { SMTPServer } from "smtp-server"

export interface ReceivedMail {
  readonly to: ReadonlyArray<string>
  readonly subject: string
  /** The plain-text part, transfer encoding undone. */
  readonly text: string
  readonly raw: string
}

export interface SmtpSink {
  readonly url: string
  readonly mails: Array<ReceivedMail>
  /** The first mail (in arrival order) to `to` whose subject matches, waiting up to `millis`. */
  readonly waitFor: (to: string, subject: RegExp, millis?: number) => Promise<ReceivedMail>
  readonly stop: () => Promise<void>
}

const decodeQuotedPrintable = (text: string) =>
  text
    .replace(/=\r?\n/g, "")
    .replace(/=([0-9A-F]{2})/g, (_, hex: string) => String.fromCharCode(Number.parseInt(hex, 16)))

/** The text/plain part of a message nodemailer built (multipart/alternative or a single part). */
const plainText = (raw: string): string => {
  const [head, ...rest] = raw.split(/\r?\n\r?\n/)
  const body = rest.join("\n\n")
  const boundary = /boundary="?([^";\r\n]+)"?/i.exec(head ?? "")?.[1]
  const parts = boundary === undefined ? [raw] : body.split(`--${boundary}`)
  for (const part of parts) {
    if (boundary !== undefined && !/content-type:\s*text\/plain/i.test(part)) continue
    const [partHead, ...partBody] = part.replace(/^\r?\n/, "").split(/\r?\n\r?\n/)
    const content = partBody.join("\n\n")
    if (/content-transfer-encoding:\s*quoted-printable/i.test(partHead ?? ""))
      return decodeQuotedPrintable(content)
    if (/content-transfer-encoding:\s*base64/i.test(partHead ?? ""))
      return Buffer.from(content.replace(/\s+/g, ""), "base64").toString("utf8")
    return content
  }
  return raw
}

const header = (raw: string, name: string) => {
  const head = raw.split(/\r?\n\r?\n/)[0] ?? ""
  const match = new RegExp(`^${name}:\\s*(.*(?:\\r?\\n[ \\t].*)*)`, "im").exec(head)
  return match?.[1]?.replace(/\r?\n[ \t]/g, " ").trim() ?? ""
}

export const startSmtpSink = async (): Promise<SmtpSink> => {
  const mails: Array<ReceivedMail> = []
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ["STARTTLS", "AUTH"],
    logger: false,
    onData(stream, session, callback) {
      const chunks: Array<Buffer> = []
      stream.on("data", (chunk: Buffer) => chunks.push(chunk))
      stream.on("end", () => {
        const raw = Buffer.concat(chunks).toString("utf8")
        mails.push({
          to: session.envelope.rcptTo.map((r) => r.address),
          subject: header(raw, "Subject"),
          text: plainText(raw),
          raw,
        })
        callback()
      })
    },
  })
  const port = await new Promise<number>((resolve, reject) => {
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.server.address()
      resolve(typeof address === "object" && address !== null ? address.port : 0)
    })
  })
  return {
    url: `smtp://127.0.0.1:${port}`,
    mails,
    waitFor: async (to, subject, millis = 10_000) => {
      const deadline = Date.now() + millis
      for (;;) {
        const found = mails.find((m) => m.to.includes(to) && subject.test(m.subject))
        if (found !== undefined) return found
        if (Date.now() > deadline)
          throw new Error(
            `no mail to ${to} matching ${subject}; got ${JSON.stringify(mails.map((m) => [m.to, m.subject]))}`,
          )
        await new Promise((r) => setTimeout(r, 25))
      }
    },
    stop: () => new Promise((resolve) => server.close(() => resolve())),
  }
}

/** The first absolute link in a mail's text that starts with `prefix`. */
export const linkIn = (mail: ReceivedMail, prefix: string): string => {
  const found = mail.text.match(/https?:\/\/\S+/g)?.find((url) => url.startsWith(prefix))
  if (found === undefined) throw new Error(`no link starting with ${prefix} in:\n${mail.text}`)
  return found
}
