export * as Quota from "./Quota"
export * as RedisStore from "./stores/Redis"
