export * as Database from "./Database"
export { migrations } from "./Migrations"
