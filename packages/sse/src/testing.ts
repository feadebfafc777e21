/**
 * For tests of stream readers (`@swarmgate/sse/testing`): bytes cut into the
 * chunks a socket could deliver them in.
 *
 * @since 0.1.0
 */

/** `bytes` cut at `points` (deduplicated, sorted, those strictly inside kept): consecutive views of it. */
export const splitAt = (bytes: Uint8Array, points: ReadonlyArray<number>): Array<Uint8Array> => {
  const inside = [...new Set(points)].filter((n) => n > 0 && n < bytes.length).sort((a, b) => a - b)
  const parts: Array<Uint8Array> = []
  let previous = 0
  for (const point of [...inside, bytes.length]) {
    parts.push(bytes.subarray(previous, point))
    previous = point
  }
  return parts
}
