/**
 * Strings kept while an answer streams, made flat. V8 holds a string joined
 * by `+` or a template literal as a rope: a 32-byte node per join, each part
 * a string of its own. Reading one character flattens a rope in place into
 * one string, and its parts become garbage. At thousands of open streams the
 * ropes a stream keeps (the response's header block, the SSE framing, the
 * answer so far) were ~5 KB of its ~45 KB (BENCHMARKS.md, 2026-11-27).
 */

/** `text`, flattened. */
export const flat = (text: string): string => {
  text.charCodeAt(0)
  return text
}

/**
 * Flattens the header block `node:http` keeps on `res` once `writeHead` built
 * it (`_header`, joined one line at a time: ~40 parts); it is kept as long as
 * the response is open.
 */
export const flatHeader = (res: object): void => {
  const header = (res as { _header?: unknown })._header
  if (typeof header === "string") flat(header)
}
