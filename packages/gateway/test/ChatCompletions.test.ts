/**
 * The SSE answer's byte order when it is stopped early: the role chunk, held
 * back to leave with the first text, still comes first when a revocation ends
 * the stream before anything was written.
 */
import { describe, expect, it } from "@effect/vitest"
import { Dispatcher } from "@swarmgate/dispatch"
import { InvalidApiKey } from "@swarmgate/protocol"
import { Chunk, Effect, Exit, Scope, Stream } from "effect"
import * as ChatCompletions from "../src/ChatCompletions"
import * as GatewayConfig from "../src/GatewayConfig"
import type { NormalizedRequest } from "../src/RequestPolicy"
import { RecordingResponse } from "./support/RecordingResponse"

const request = {
  preset: { id: "swarm-prime", timeoutMillis: 10_000 },
  model: "swarm-prime",
  messages: [],
  stream: true,
  includeUsage: false,
  jsonMode: false,
  maxTokens: 100,
  promptTokens: 1,
  sampling: {},
} as unknown as NormalizedRequest

/** A node whose first text arrives a moment later, by callback (an HTTP node's `next`). */
const laterNode: Dispatcher.NodeRun = {
  nodeId: "n1",
  pull: Effect.never,
  next: (done: (exit: Exit.Exit<Chunk.Chunk<{ _tag: "Delta"; text: string }>>) => void) => {
    const timer = setTimeout(() => done(Exit.succeed(Chunk.of({ _tag: "Delta", text: "Hi" }))), 20)
    return () => clearTimeout(timer)
  },
  events: Stream.empty,
} as unknown as Dispatcher.NodeRun

/** Below this Effect 3's own yield (about nine operations) never lets a fiber move on. */
const MIN_OPS = 10

/** One answer on a fiber of its own (a stop interrupts the answer's fiber), real clock. */
const answer = async (maxOps: number) => {
  let revoke: ((error: InvalidApiKey) => void) | undefined
  const res = new RecordingResponse(() => revoke?.(new InvalidApiKey({ message: "The key was revoked." })))
  const outcome = ChatCompletions.newOutcome()
  // As the gateway runs it: the scope given, none in the fiber's context (a read of it would fail).
  await Effect.runPromiseExit(
    Effect.flatMap(Scope.make(), (scope) =>
      ChatCompletions.respondIn(scope, res as never, "req_test", request, outcome, {
        onRevocation: (stop) => {
          revoke = stop
          return () => undefined
        },
      }).pipe(
        Effect.withMaxOpsBeforeYield(maxOps),
        Effect.onExit((exit) => Scope.close(scope, exit)),
      ),
    ).pipe(
      Effect.provideService(Dispatcher.Dispatcher, { runIn: () => Effect.succeed(laterNode) } as never),
      Effect.provide(GatewayConfig.layer({})),
    ),
  )
  return res
}

describe("an SSE answer stopped before its first write", () => {
  it("still starts with the role chunk and ends with the error event, wherever the stop lands", async () => {
    // Yielding after every few operations moves the revocation to each point between the head and
    // the first read of the node: one of them is before the role chunk would have been written.
    let streamed = 0
    for (let maxOps = MIN_OPS; maxOps <= 80; maxOps++) {
      const res = await answer(maxOps)
      if (res.status !== 200) continue
      streamed++
      const events = res.body.split("\n\n").filter((e) => e.length > 0)
      expect(events[0]).toContain('"delta":{"role":"assistant","content":""}')
      expect(events.at(-1)).toContain('"code":"upstream_error"')
      expect(res.body).not.toContain("[DONE]")
    }
    expect(streamed).toBeGreaterThan(0)
  })
})
