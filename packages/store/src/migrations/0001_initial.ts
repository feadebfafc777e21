import { SqlClient } from "@effect/sql"
import { Effect } from "effect"

// Money in integer micro-dollars (BIGINT), times in Unix milliseconds, flags as 0/1:
// the same DDL and the same queries work on SQLite and PostgreSQL.
export default Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE accounts (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    payment_hold INTEGER NOT NULL DEFAULT 0,
    balance_micros BIGINT NOT NULL DEFAULT 0,
    monthly_spend_limit_micros BIGINT,
    limits TEXT NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
  )`
  yield* sql`CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id),
    key_hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    name TEXT,
    disabled INTEGER NOT NULL DEFAULT 0,
    revoked_at BIGINT,
    expires_at BIGINT,
    spend_limit_micros BIGINT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX api_keys_account ON api_keys(account_id)`
  yield* sql`CREATE TABLE balance_movements (
    id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id),
    kind TEXT NOT NULL,
    amount_micros BIGINT NOT NULL,
    request_id TEXT,
    created_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX balance_movements_account ON balance_movements(account_id, created_at)`
  yield* sql`CREATE TABLE usage_records (
    request_id TEXT PRIMARY KEY,
    account_id TEXT NOT NULL REFERENCES accounts(id),
    key_id TEXT NOT NULL REFERENCES api_keys(id),
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_micros BIGINT NOT NULL,
    outcome TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    created_at BIGINT NOT NULL
  )`
  yield* sql`CREATE INDEX usage_records_account ON usage_records(account_id, created_at)`
  yield* sql`CREATE INDEX usage_records_key ON usage_records(key_id, created_at)`
})
