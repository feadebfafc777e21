export * as Database from "./Database"
export { migrations } from "./Migrations"
export * as Redis from "./Redis"
export * as TestDatabase from "./testing/TestDatabase"
