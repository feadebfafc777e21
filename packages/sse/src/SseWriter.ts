/**
 * Writing a stream to a slow reader: wait for `drain` when the socket buffer
 * is full, so the reader's pace reaches whoever produces the data instead of
 * piling up in memory.
 *
 * @since 0.1.0
 */
import type { ServerResponse } from "node:http"
import { Effect } from "effect"

/** Writes `data`; completes at once, or once the buffer drained (or the response closed). */
export const write = (res: ServerResponse, data: string): Effect.Effect<void> =>
  res.write(data)
    ? Effect.void
    : Effect.async<void>((resume) => {
        const done = () => {
          res.off("drain", done)
          res.off("close", done)
          resume(Effect.void)
        }
        res.on("drain", done)
        res.on("close", done)
        return Effect.sync(() => {
          res.off("drain", done)
          res.off("close", done)
        })
      })
