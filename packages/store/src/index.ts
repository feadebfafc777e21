export * as Database from "./Database"
export { migrations } from "./Migrations"
export * as TestDatabase from "./testing/TestDatabase"
