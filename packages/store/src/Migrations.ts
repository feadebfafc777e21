import { Migrator } from "@effect/sql"
import initial from "./migrations/0001_initial"
import lifecycle from "./migrations/0002_lifecycle"

/** Numbered migrations, shared by SQLite and PostgreSQL. */
export const migrations = Migrator.fromRecord({
  "0001_initial": initial,
  "0002_lifecycle": lifecycle,
})
