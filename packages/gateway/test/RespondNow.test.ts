/**
 * The answer by plain calls (`respondNow`, what the listener runs for the
 * common request) against the Effect path (`respondIn`): for any node
 * stream — chunks at once or later, a finish, a failure, the token cap —
 * both write the same bytes, end the same way and leave the same outcome;
 * a run handed over as an Effect goes on the Effect way; a throw in a
 * callback is the request's defect, not the event loop's.
 */
import { describe, expect, it } from "@effect/vitest"
import { Dispatcher, Finalizers, type NodeEvent, NodeFailure } from "@swarmgate/dispatch"
import { Cause, Chunk, Effect, Exit, FiberId, Option, Runtime, Scope, Stream } from "effect"
import fc from "fast-check"
import * as ChatCompletions from "../src/ChatCompletions"
import * as GatewayConfig from "../src/GatewayConfig"
import type { NormalizedRequest } from "../src/RequestPolicy"
import { RecordingResponse } from "./support/RecordingResponse"

type Step =
  | { readonly _tag: "Chunk"; readonly events: ReadonlyArray<NodeEvent>; readonly later: boolean }
  | { readonly _tag: "Fail"; readonly later: boolean }

/** A run whose events come by callback (an HTTP node's `next`), at once or a turn later. */
const runOf = (steps: ReadonlyArray<Step>): Dispatcher.NodeRun => {
  let i = 0
  const next = (done: (exit: Exit.Exit<Chunk.Chunk<NodeEvent>, Option.Option<NodeFailure>>) => void) => {
    const step = steps[i++]
    const exit =
      step === undefined
        ? Exit.fail(Option.none())
        : step._tag === "Fail"
          ? Exit.fail(Option.some(new NodeFailure({ nodeId: "n1", reason: "broken" })))
          : Exit.succeed(Chunk.fromIterable(step.events))
    if (step === undefined || !step.later) {
      done(exit)
      return () => undefined
    }
    const timer = setTimeout(() => done(exit), 0)
    return () => clearTimeout(timer)
  }
  return { nodeId: "n1", pull: Effect.never, next, events: Stream.empty } as unknown as Dispatcher.NodeRun
}

const requestOf = (stream: boolean, includeUsage: boolean, maxTokens: number) =>
  ({
    preset: { id: "swarm-prime", timeoutMillis: 10_000 },
    model: "swarm-prime",
    messages: [],
    stream,
    includeUsage,
    jsonMode: false,
    maxTokens,
    promptTokens: 3,
    sampling: {},
  }) as unknown as NormalizedRequest

type Path = "effect" | "plain" | "handed over"

/** One answer on `path`; its response, exit and outcome. */
const answer = async (
  path: Path,
  request: NormalizedRequest,
  run: Dispatcher.NodeRun,
  hooks: ChatCompletions.RespondHooks = {},
  /** The run handed over a turn later (as a node's first event comes), not within `beginIn`. */
  beginLater = false,
) => {
  const res = new RecordingResponse()
  const outcome = ChatCompletions.newOutcome()
  const dispatcher = {
    runIn: () => Effect.succeed(run),
    beginIn: (
      _scope: unknown,
      _runtime: unknown,
      _preset: unknown,
      _request: unknown,
      done: Dispatcher.Begun,
    ) => {
      const begun = () =>
        done(path === "plain" ? Exit.succeed(run) : Effect.suspend(() => Effect.succeed(run)))
      if (beginLater) setTimeout(begun, 0)
      else begun()
    },
  } as unknown as Dispatcher.DispatcherShape
  const config = GatewayConfig.defaults
  const runtime = Runtime.defaultRuntime
  const body = (
    scope: Scope.Scope,
  ): Effect.Effect<void, unknown, Dispatcher.Dispatcher | GatewayConfig.GatewayConfig> =>
    path === "effect"
      ? ChatCompletions.respondIn(scope, res as never, "req_test", request, outcome, hooks)
      : Effect.withFiberRuntime<void, unknown>((fiber) =>
          Finalizers.asyncIn<void, unknown>(scope, (resume) => {
            ChatCompletions.respondNow(
              scope,
              res as never,
              "req_test",
              request,
              outcome,
              hooks,
              dispatcher,
              config,
              runtime,
              () => fiber.unsafeInterruptAsFork(FiberId.none),
              resume,
            )
            return undefined
          }),
        )
  const exit = await Effect.runPromiseExit(
    Effect.flatMap(Scope.make(), (scope) =>
      body(scope).pipe(Effect.onExit((exit) => Scope.close(scope, exit))),
    ).pipe(
      Effect.provideService(Dispatcher.Dispatcher, dispatcher),
      Effect.provideService(GatewayConfig.GatewayConfig, config),
    ),
  )
  // The second of `created` may differ between two answers.
  return { res, exit, outcome, body: res.body.replace(/"created":\d+/g, '"created":0') }
}

const event = fc.oneof(
  { weight: 6, arbitrary: fc.string({ maxLength: 12 }).map((text): NodeEvent => ({ _tag: "Delta", text })) },
  {
    weight: 1,
    arbitrary: fc.constantFrom("stop", "length").map((reason): NodeEvent => ({ _tag: "Finish", reason })),
  },
)
const step: fc.Arbitrary<Step> = fc.oneof(
  {
    weight: 8,
    arbitrary: fc.record({
      _tag: fc.constant("Chunk" as const),
      events: fc.array(event, { maxLength: 4 }),
      later: fc.boolean(),
    }),
  },
  { weight: 1, arbitrary: fc.record({ _tag: fc.constant("Fail" as const), later: fc.boolean() }) },
)

describe("respondNow", () => {
  it("writes the same answer as respondIn, for any stream, cap and failure, handed over or not", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(step, { maxLength: 8 }),
        fc.boolean(),
        fc.boolean(),
        fc.integer({ min: 1, max: 40 }),
        fc.boolean(),
        async (steps, stream, includeUsage, maxTokens, beginLater) => {
          const request = requestOf(stream, includeUsage, maxTokens)
          const general = await answer("effect", request, runOf(steps))
          for (const path of ["plain", "handed over"] as const) {
            const other = await answer(path, request, runOf(steps), {}, beginLater)
            expect(other.body).toBe(general.body)
            expect(other.res.status).toBe(general.res.status)
            expect(other.res.headers).toEqual(general.res.headers)
            expect(other.outcome).toEqual(general.outcome)
            expect(Exit.isSuccess(other.exit)).toBe(Exit.isSuccess(general.exit))
            if (Exit.isFailure(other.exit) && Exit.isFailure(general.exit))
              expect(Cause.squash(other.exit.cause)).toEqual(Cause.squash(general.exit.cause))
          }
        },
      ),
      { numRuns: 150 },
    )
  })

  it("a hook that throws in a callback fails the request as a defect; the event loop never sees it", async () => {
    const run = runOf([{ _tag: "Chunk", events: [{ _tag: "Delta", text: "Hi" }], later: true }])
    const { exit, res } = await answer(
      "plain",
      requestOf(false, false, 10),
      run,
      {
        onRun: () => {
          throw new Error("hook broke")
        },
      },
      true,
    )
    expect(Exit.isFailure(exit) && Cause.isDie(exit.cause)).toBe(true)
    expect(res.body).toBe("")
  })
})
