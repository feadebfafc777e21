export * from "./Errors"
export * from "./Render"
export * from "./RequestDecoding"
export * from "./Schemas"
