import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// Access by application and the account lifecycle (issue #16). Accounts made before it have no
// address and count as verified; tokens and sessions are stored as SHA-256 hashes only.
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE accounts ADD COLUMN email TEXT`
  yield* sql`ALTER TABLE accounts ADD COLUMN email_verified INTEGER NOT NULL DEFAULT 1`
  yield* sql`ALTER TABLE accounts ADD COLUMN closed_at BIGINT`
  yield* sql`CREATE TABLE applications (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    organization TEXT,
    use_case TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    account_id TEXT REFERENCES accounts(id),
    created_at BIGINT NOT NULL,
    decided_at BIGINT,
    updated_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX applications_email ON applications(email, status)`
  // At most one open application per address, even when two arrive at once on two instances.
  yield* sql`CREATE UNIQUE INDEX applications_open_email ON applications(email)
    WHERE status IN ('pending_verification', 'pending_review')`
  yield* sql`CREATE INDEX applications_created ON applications(created_at)`
  // One-time links (verify an application, claim a key, verify an address). `sealed` holds a
  // claim's key encrypted under the token itself, so the database alone cannot reveal it.
  yield* sql`CREATE TABLE access_tokens (
    token_hash TEXT PRIMARY KEY,
    purpose TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    sealed TEXT,
    expires_at BIGINT NOT NULL,
    used_at BIGINT,
    created_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX access_tokens_subject ON access_tokens(subject_id, purpose)`
  yield* sql`CREATE TABLE mail_outbox (
    id TEXT PRIMARY KEY,
    recipient TEXT NOT NULL,
    subject TEXT NOT NULL,
    text_body TEXT NOT NULL,
    html_body TEXT,
    created_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX mail_outbox_created ON mail_outbox(created_at)`
  yield* sql`CREATE TABLE apply_attempts (
    client TEXT NOT NULL,
    created_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX apply_attempts_client ON apply_attempts(client, created_at)`
  yield* sql`CREATE TABLE console_sessions (
    session_hash TEXT PRIMARY KEY,
    csrf_token TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL
  )`
})
