/** The admin side's own services for tests: links under a fixed public URL, mail kept in the outbox. */
import { Layer } from "effect"
import * as AdminConfig from "../../src/AdminConfig"
import * as Mail from "../../src/Mail"

export const PUBLIC_URL = "http://swarmgate.test"

export const configLayer = (overrides: Partial<AdminConfig.AdminConfigShape> = {}) =>
  AdminConfig.layer({ ...AdminConfig.defaults(PUBLIC_URL), ...overrides })

/** Needs a SqlClient (the outbox table). */
export const outboxLayer = (overrides: Partial<AdminConfig.AdminConfigShape> = {}) =>
  Mail.layer.pipe(Layer.provideMerge(configLayer(overrides)))
