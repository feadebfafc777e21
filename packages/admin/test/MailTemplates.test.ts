import { describe, expect, it } from "@effect/vitest"
import * as MailTemplates from "../src/MailTemplates"

const URL_ = "https://api.example.com/apply/claim?token=abc-DEF_123"

describe("mail", () => {
  it("every mail with a link has it as an absolute URL on its own line of the plain text, and in the HTML", () => {
    for (const mail of [
      MailTemplates.verifyApplication("a@example.org", "Ada", URL_),
      MailTemplates.approved("a@example.org", "Ada", URL_),
      MailTemplates.verifyAddress("a@example.org", "Ada", URL_),
    ]) {
      expect(mail.to).toBe("a@example.org")
      expect(mail.text.split("\n")).toContain(URL_)
      expect(mail.html).toContain(`href="${URL_}"`)
    }
  })

  it("escapes what people typed in the HTML part", () => {
    const mail = MailTemplates.rejected("a@example.org", "<script>x</script>", 'Not "now" & <b>never</b>')
    expect(mail.text).toContain("<script>x</script>")
    expect(mail.html).not.toContain("<script>")
    expect(mail.html).toContain("&lt;script&gt;x&lt;/script&gt;")
    expect(mail.html).toContain("&quot;now&quot; &amp; &lt;b&gt;")
  })

  it("the statement lists credits, charges, refunds and balance", () => {
    const mail = MailTemplates.statement("a@example.org", "Ada", {
      accountId: "acct_1",
      creditsUsd: 5,
      chargesUsd: 1.25,
      refundsUsd: 0,
      balanceUsd: 3.75,
      closedAt: "2026-11-25T12:00:00.000Z",
    })
    expect(mail.text).toContain("acct_1")
    expect(mail.text).toContain(
      "Credits: 5.000000 USD\nCharges: 1.250000 USD\nRefunds: 0.000000 USD\nBalance: 3.750000 USD",
    )
  })
})
