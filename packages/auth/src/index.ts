export * as ApiKeys from "./ApiKeys"
export * from "./Domain"
export * as KeyFormat from "./KeyFormat"
export * as Repository from "./Repository"
