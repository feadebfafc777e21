export * from "./Judging"
export * from "./Profiles"
export * from "./SimNode"
export * from "./TextGenerator"
