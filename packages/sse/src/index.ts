/**
 * @since 0.1.0
 */
export * as SseDecoder from "./SseDecoder"

/**
 * @since 0.1.0
 */
export * as SseEncoder from "./SseEncoder"

/**
 * @since 0.1.0
 */
export * as SseWriter from "./SseWriter"
