/**
 * The HTTP surface on plain `node:http`: routing, request ids, bodies with
 * their limits, and the one place where failures are rendered. A request
 * runs as one fiber, or — the common chat completion — by plain calls until
 * a step needs one (`PlainRun`); a client that goes away interrupts it,
 * which cancels the node stream and releases everything acquired for it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import type { SqlClient } from "@effect/sql"
import { ApiKeys, type Principal, type Repository } from "@swarmgate/auth"
import { Billing as BillingService, type Ledger } from "@swarmgate/billing"
import { Dispatcher, Finalizers } from "@swarmgate/dispatch"
import {
  AdmissionUnavailable,
  type ApiError,
  decodeChatCompletionRequest,
  exitOf,
  InternalError,
  InvalidRequest,
  isApiError,
  Observed,
  REQUEST_ID_HEADER,
  streamErrorEvent,
  UnsupportedMediaType,
} from "@swarmgate/protocol"
import { Quota } from "@swarmgate/quota"
import {
  Cause,
  Clock,
  Context,
  Effect,
  Either,
  Exit,
  type Fiber,
  FiberId,
  FiberRefs,
  HashSet,
  Option,
  Runtime,
  Scope,
} from "effect"
import * as DefaultServices from "effect/DefaultServices"
import * as Billing from "./Billing"
import * as ChatCompletions from "./ChatCompletions"
import { GatewayConfig, type GatewayConfigShape } from "./GatewayConfig"
import * as HeapPolicy from "./HeapPolicy"
import {
  closeAfterUnreadBody,
  empty,
  isJsonContentType,
  listenBody,
  parseJson,
  readJson,
  sendError,
  sendJson,
} from "./HttpIo"
import { onClientError, onConnect, onUnmetExpectation } from "./internal/ClientErrors"
import * as Limits from "./Limits"
import * as Models from "./Models"
import * as Operations from "./Operations"
import { newRequestId } from "./RequestId"
import { type NormalizedRequest, normalize, type PresetView } from "./RequestPolicy"
import * as RequestRun from "./RequestRun"
import * as SideRoutes from "./SideRoutes"

export type GatewayServices =
  | ApiKeys.ApiKeys
  | BillingService.Billing
  | Dispatcher.Dispatcher
  | GatewayConfig
  | Limits.LimitsConfig
  | Quota.Quota
  | Repository.Repository
  | SqlClient.SqlClient

const writeError = (req: IncomingMessage, res: ServerResponse, requestId: string, error: ApiError) => {
  if (res.headersSent) {
    // Only defects get here after the stream started: end it with the final error event.
    if (!res.writableEnded) {
      res.end(
        `data: ${streamErrorEvent({ message: "The request failed after it started.", type: "server_error", code: "upstream_error" }, requestId)}\n\n`,
      )
    }
    return
  }
  sendError(req, res, requestId, error)
}

/** Storage trouble while authenticating is ours, not the caller's: a retryable 503. */
const storageUnavailable = () =>
  new AdmissionUnavailable({ message: "The service cannot accept the request now.", retryAfterSeconds: 1 })

const authenticate = (keys: ApiKeys.ApiKeysShape, req: IncomingMessage) =>
  Effect.catchTag(keys.authenticate(req.headers.authorization), "RepositoryUnavailable", () =>
    Effect.fail(storageUnavailable()),
  )

/**
 * The services a request reads, taken from the listener's runtime once: a
 * service read by `yield*` costs two run-loop steps per request each.
 */
interface RequestServices {
  readonly apiKeys: ApiKeys.ApiKeysShape
  readonly config: GatewayConfigShape
  readonly dispatcher: Dispatcher.DispatcherShape
  readonly limits: Limits.LimitsConfigShape
  readonly quota: Quota.QuotaShape
  readonly billing: BillingService.BillingShape
  /** The requests' runtime's clock (the plain path reads the time through it, as a fiber would). */
  readonly clock: Clock.Clock
  /** The requests' runtime, for code on no fiber (the plain path's dispatch). */
  readonly runtime: Runtime.Runtime<never>
  /** Runs an effect on the listener's runtime (a key checked again when it changed). */
  readonly runFork: <A, E>(effect: Effect.Effect<A, E, GatewayServices>) => Fiber.RuntimeFiber<A, E>
  /** Runs a request's effect on the requests' runtime (no `Scope` in its context). */
  readonly runRequest: <A, E>(effect: Effect.Effect<A, E, GatewayServices>) => Fiber.RuntimeFiber<A, E>
}

/**
 * A request as the edge received it, made once by the listener and passed
 * down: its `node:http` pair, id and arrival, the services it reads, and its
 * scope (made by the listener, passed down as this value — not in a
 * fiber's context — and closed when the request ends).
 */
interface EdgeRequest {
  readonly req: IncomingMessage
  readonly res: ServerResponse
  readonly requestId: string
  readonly startedAt: number
  readonly services: RequestServices
  readonly scope: Scope.CloseableScope
}

/*
 * The request path's Effect.gen bodies (here, the single strategy's loop, the
 * answer, admission, /v1/models) are generator functions
 * declared once, at module level, given the request as arguments — not
 * `Effect.gen(function* () { … })` made per request (the paths that wait —
 * the dispatch and concurrency queues, a key-cache miss, consensus — still
 * make theirs). V8 gives every
 * generator-function closure a hidden class of its own in the old generation,
 * pointing back at the closure: all it captures (the request, the response,
 * their state) then outlives young collections. An object literal with a
 * getter does the same (test/SourceShapes.test.ts keeps those out). With
 * these gone and `--no-allocation-site-pretenuring` (set by the bin), a chat
 * completion promotes ~1 KB instead of ~21 KB (BENCHMARKS.md, 2026-11-26).
 */
function* chatCompletionBody(edge: EdgeRequest) {
  const { req, res, services } = edge
  const principal = yield* authenticate(services.apiKeys, req)
  Operations.notePrincipal(res, principal)
  if (!isJsonContentType(req.headers["content-type"])) return yield* unsupportedMediaType()
  const json = yield* readJson(req, services.config, edge.startedAt, edge.scope)
  const request = yield* requestOf(json, services, principal)
  Operations.noteRequest(res, request)
  // In the request's scope (made by the listener): it closes when the request's fiber ends.
  yield* serve(edge, principal, request)
}

/** The general path: every step the Effect way (a key the cache does not know, tests of it). */
const chatCompletion = (edge: EdgeRequest) => Effect.gen(() => chatCompletionBody(edge))

const unsupportedMediaType = () =>
  new UnsupportedMediaType({ message: "Content-Type must be application/json." })

/** The body's JSON decoded and normalised: the request, or its 400/404/413/422. */
const requestOf = (
  json: unknown,
  services: RequestServices,
  principal: Principal,
): Either.Either<NormalizedRequest, ApiError> => {
  const decoded = decodeChatCompletionRequest(json)
  if (Either.isLeft(decoded)) return Either.left(decoded.left)
  return normalize(
    decoded.right,
    json as Record<string, unknown>,
    (id) => presetView(services.dispatcher, id),
    services.config.maxImageBytes,
    principal.account.id,
  )
}

/**
 * The chat completion by plain calls, on no fiber: the key from the cache,
 * the body by callback, decode and policy, admission and hold in memory, the
 * run begun and read by callback, the answer written; scaled out, the
 * admission's and hold's Redis replies read by callback. Where a step needs
 * Effect (a key to look up, a queue, a refusal or failure from Redis, the
 * strategy's loop, a run read by `pull`), `run.done` gets the Effect that goes on from there — the
 * general path's own code — and runs it on a fiber. The same refusals, in
 * the same order.
 */
const chatCompletionPlain = (edge: EdgeRequest, run: PlainRun): void => {
  const { req, res, services } = edge
  const authenticated = services.apiKeys.authenticateNow(
    req.headers.authorization,
    services.clock.unsafeCurrentTimeMillis(),
  )
  if (authenticated === undefined) {
    run.done(chatCompletion(edge))
    return
  }
  if (Either.isLeft(authenticated)) {
    run.done(Exit.fail(authenticated.left))
    return
  }
  const principal = authenticated.right
  Operations.notePrincipal(res, principal)
  if (!isJsonContentType(req.headers["content-type"])) {
    run.done(Exit.fail(unsupportedMediaType()))
    return
  }
  const cleanup = listenBody(req, services.config, edge.startedAt, parseJson, (body) =>
    run.guarded(() => {
      if (Exit.isFailure(body)) return run.done(body)
      const request = requestOf(body.value, services, principal)
      if (Either.isLeft(request)) return run.done(Exit.fail(request.left))
      Operations.noteRequest(res, request.right)
      serveNow(edge, principal, request.right, run)
    }),
  )
  if (cleanup !== undefined) Finalizers.addNow(edge.scope, cleanup)
}

/** What a request being served starts with: its outcome, and its gauges (ended with its scope). */
const startServing = (edge: EdgeRequest) => {
  const outcome = ChatCompletions.newOutcome()
  const gauges = Operations.gauges(edge.res)
  gauges.waiting()
  // A plain cleanup: it shares one scope finalizer with the permit's, the hold's and the answer's.
  Finalizers.addNow(edge.scope, gauges.finished)
  return { outcome, gauges }
}

/** Spec §5.7: when the limits leave less than the worst case, the completion is capped at what they pay. */
const servedFor = (request: NormalizedRequest, hold: BillingService.Hold): NormalizedRequest =>
  hold.maxTokens < request.maxTokens ? { ...request, maxTokens: hold.maxTokens } : request

const hooksFor = (edge: EdgeRequest, principal: Principal, permit: Quota.Permit) =>
  Operations.respondHooks(edge.res, permit, revocation(edge, principal))

/**
 * Admission, the hold and the answer, in one scope: the node stream, the
 * permit and the hold are released there, whatever ends the request.
 */
function* serveBody(edge: EdgeRequest, principal: Principal, request: NormalizedRequest) {
  const { outcome, gauges } = startServing(edge)
  const admitted = yield* admitAndHold(edge, principal, request, outcome, gauges)
  yield* respondAdmitted(edge, principal, request, outcome, admitted)
}

const serve = (edge: EdgeRequest, principal: Principal, request: NormalizedRequest) =>
  Effect.gen(() => serveBody(edge, principal, request))

const respondAdmitted = (
  edge: EdgeRequest,
  principal: Principal,
  request: NormalizedRequest,
  outcome: ChatCompletions.Outcome,
  { permit, hold }: Admitted,
) =>
  ChatCompletions.respondIn(
    edge.scope,
    edge.res,
    edge.requestId,
    servedFor(request, hold),
    outcome,
    hooksFor(edge, principal, permit),
  )

/** `serve` by plain calls (see `chatCompletionPlain`): `run.done` gets the rest, or how it ended. */
const serveNow = (edge: EdgeRequest, principal: Principal, request: NormalizedRequest, run: PlainRun) => {
  const { services } = edge
  const { outcome, gauges } = startServing(edge)
  const admitted = admitAndHoldWith(
    edge,
    principal,
    request,
    outcome,
    gauges,
    services.quota,
    services.billing,
    services.clock,
  )
  if (Either.isEither(admitted)) answerAdmitted(edge, principal, request, outcome, run, admitted)
  else
    Observed.observe(admitted, (decided) =>
      run.guarded(() => answerAdmitted(edge, principal, request, outcome, run, decided)),
    )
}

/** The answer once admitted and held by plain calls; anything else goes on by Effect, or ends the request. */
const answerAdmitted = (
  edge: EdgeRequest,
  principal: Principal,
  request: NormalizedRequest,
  outcome: ChatCompletions.Outcome,
  run: PlainRun,
  /** An `Either` where both decided in memory, an `Exit` where the store's replies did. */
  admitted: Either.Either<Admitted, AdmissionError> | Effect.Effect<Admitted, AdmissionError>,
) => {
  const { services } = edge
  let both: Admitted
  if (Either.isEither(admitted)) {
    if (Either.isLeft(admitted)) return run.done(Exit.fail(admitted.left))
    both = admitted.right
  } else {
    const exit = exitOf(admitted)
    if (exit === undefined)
      return run.done(
        Effect.flatMap(admitted, (both) => respondAdmitted(edge, principal, request, outcome, both)),
      )
    if (Exit.isFailure(exit)) return run.done(exit)
    both = exit.value
  }
  const { permit, hold } = both
  ChatCompletions.respondNow(
    edge.scope,
    edge.res,
    edge.requestId,
    servedFor(request, hold),
    outcome,
    hooksFor(edge, principal, permit),
    services.dispatcher,
    services.config,
    services.runtime,
    run.interrupt,
    run.done,
  )
}

type Admitted = { readonly permit: Quota.Permit; readonly hold: BillingService.Hold }
type AdmissionError = Quota.Refusal | AdmissionUnavailable | BillingService.ReserveRefusal

/**
 * The permit, then the hold — in that order where both decide in memory, and
 * then by plain calls in one step. Where both are round trips to Redis
 * (scaled out) both scripts are sent by plain calls in one synchronous run —
 * one write on the shared connection — before the request waits for either
 * (no fiber per command), and their release and settlement likewise, by one
 * finalizer put in place at once: one round trip to start a request and one
 * to end it. The admission's refusal still wins over the hold's, and
 * whichever of the two succeeded is undone by the scope when the other
 * refused. What this changes: a request queued for a concurrency slot holds
 * its money while it waits. The permit is released, and the hold settled
 * from `outcome` (or voided), when `scope` closes: rate and quota units are
 * refunded unless generation started.
 */
const admitAndHold = (
  edge: EdgeRequest,
  principal: Principal,
  request: NormalizedRequest,
  outcome: ChatCompletions.Outcome,
  gauges: Operations.Gauges,
): Effect.Effect<Admitted, AdmissionError, Quota.Quota | BillingService.Billing> =>
  Effect.withFiberRuntime((fiber) =>
    admitAndHoldWith(
      edge,
      principal,
      request,
      outcome,
      gauges,
      Context.unsafeGet(fiber.currentContext, Quota.Quota),
      Context.unsafeGet(fiber.currentContext, BillingService.Billing),
      Context.get(fiber.currentDefaultServices, Clock.Clock),
    ),
  )

/**
 * `admitAndHold` by plain calls, the services given: an `Either` where
 * both decided in memory (an Either is an Effect too), else the Effect that
 * waits for them — observable (`Observed`) where both were sent to the
 * shared store: their replies are read by callback.
 */
const admitAndHoldWith = (
  edge: EdgeRequest,
  principal: Principal,
  request: NormalizedRequest,
  outcome: ChatCompletions.Outcome,
  gauges: Operations.Gauges,
  quota: Quota.QuotaShape,
  billing: BillingService.BillingShape,
  clock: Clock.Clock,
): Either.Either<Admitted, AdmissionError> | Effect.Effect<Admitted, AdmissionError> => {
  const { res, requestId, services, scope } = edge
  const model = request.preset.id
  const waitMillis = Limits.moneyWaitMillis(principal.account, services.limits)
  const onSettled = (settlement: BillingService.Settlement, entry: Ledger.UsageEntry | undefined) =>
    Operations.noteSettled(res, settlement, entry)
  const admission = Limits.admitRequest(principal, model, services.limits)
  /** The hold, once admitted: by plain calls where the book decides at once, else its Effect path. */
  const holdFor = (permit: Quota.Permit) => {
    gauges.admitted()
    const input = Billing.reserveInput(principal, requestId, request, waitMillis)
    const held = Billing.holdNow(billing, scope, clock, input, outcome, onSettled)
    if (held !== undefined) return Either.map(held, (hold) => ({ permit, hold }))
    return Effect.map(Billing.holdWaiting(billing, scope, input, outcome, onSettled), (hold) => ({
      permit,
      hold,
    }))
  }
  const admitted = Limits.admitNow(res, quota, admission, outcome, scope, clock)
  if (admitted !== undefined) {
    if (Either.isLeft(admitted)) {
      gauges.refused()
      return Either.left(admitted.left)
    }
    return holdFor(admitted.right)
  }
  const admitSent = quota.admitSent
  const reserveSent = billing.reserveSent
  if (admitSent === undefined || reserveSent === undefined) {
    const admitting = Effect.tapError(Limits.admitWaiting(res, quota, admission, outcome, scope), () =>
      Effect.sync(gauges.refused),
    )
    return Effect.flatMap(admitting, holdFor)
  }
  // Both sent in this synchronous run: the admission's and the hold's scripts leave in one write.
  // The hold is placed before a queue wait for a slot, so it lives that much longer.
  const queueWait = admission.limits.concurrency?.maxWaitMillis ?? 0
  const input = Billing.reserveInput(principal, requestId, request, waitMillis, queueWait)
  const admittingSent = admitSent(admission, clock)
  let permitted = false
  let holding: BillingService.HoldSent | undefined
  // In place before anything else can happen (the hold's send included): whatever happens next,
  // both are undone or resolved — in one write too, and each even if the other dies.
  // Observed: a plain close reads both replies by callback, on no fiber (`Finalizers.addObservedNow`).
  Finalizers.addObservedNow(scope, (exit) =>
    bothRun(
      () => Limits.releaseSent(res, admittingSent, outcome, permitted),
      () =>
        holding === undefined
          ? Effect.void
          : Billing.resolveSent(holding, outcome, exit, clock.unsafeCurrentTimeMillis(), onSettled),
    ),
  )
  holding = reserveSent(input, clock.unsafeCurrentTimeMillis())
  const held = holding
  // The admission's refusal wins over the hold's: it is read first. Each reply is read by plain
  // calls where the caller can (`Observed`); a step that needs Effect (a refusal's release, a
  // queue, a failure) goes on by Effect, and a throw is the request's defect.
  return Observed.onExit(admittingSent.admission, (admission) => {
    const permit = admittedBy(admission)
    if (Exit.isExit(permit)) return permit
    return Observed.onExit(held.hold, (hold) =>
      Exit.isSuccess(hold)
        ? Exit.succeed({ permit, hold: hold.value })
        : Effect.map(Billing.heldSent(hold), (placed) => ({ permit, hold: placed })),
    )
  })
  /** The store's decision: the permit (its rates noted), or the refusal as an `Exit`. */
  function admittedBy(
    admission: Exit.Exit<Quota.Admission, AdmissionUnavailable>,
  ): Quota.Permit | Exit.Exit<never, AdmissionError> {
    if (Exit.isFailure(admission)) {
      gauges.refused()
      // A failure carries no value: its type is the admission's.
      return admission as Exit.Exit<never, AdmissionUnavailable>
    }
    const decided = admission.value
    if (decided._tag === "Refused") {
      Limits.setRateHeaders(res, decided.rates)
      gauges.refused()
      return Exit.fail(decided.error)
    }
    permitted = true
    Limits.setRateHeaders(res, decided.permit.rates)
    gauges.admitted()
    return decided.permit
  }
}

/**
 * Both Effects made and run, each even if the other's making threw or its
 * run died: the failures, in order, are the result.
 */
const bothRun = (
  first: () => Effect.Effect<void>,
  second: () => Effect.Effect<void>,
): Effect.Effect<void> => {
  const made = (make: () => Effect.Effect<void>) => {
    try {
      return make()
    } catch (thrown) {
      return Exit.die(thrown)
    }
  }
  // Both made (so both sent) before either is waited for; observable where both are (`Observed`).
  const a = made(first)
  const b = made(second)
  return Observed.onExit(a, (ea) =>
    Observed.onExit(b, (eb) =>
      Exit.isSuccess(ea)
        ? eb
        : Exit.isSuccess(eb)
          ? ea
          : Exit.failCause(Cause.sequential(ea.cause, eb.cause)),
    ),
  )
}

/**
 * Spec §5: revoking a key stops the applications using it. When the key or
 * its account changes (here or, through the invalidation bus, on another
 * instance), the request's key is checked again; a refusal now ends it.
 */
const revocation =
  ({ req, services }: EdgeRequest, principal: Principal) =>
  (revoke: (error: ApiError) => void) =>
    services.apiKeys.watch(principal.key.id, principal.account.id, () => {
      services.runFork(services.apiKeys.authenticate(req.headers.authorization, true)).addObserver((exit) => {
        if (Exit.isSuccess(exit)) return
        const failure = Cause.failureOption(exit.cause)
        // Storage trouble says nothing about the key: the request runs on.
        if (Option.isSome(failure) && isApiError(failure.value)) revoke(failure.value)
      })
    })

/** Vision is a property of the nodes behind a preset; nodes come and go, so it is looked up per request. */
const presetView = (dispatcher: Dispatcher.DispatcherShape, id: string): PresetView | undefined => {
  const preset = dispatcher.preset(id)
  return preset === undefined ? undefined : { preset, vision: preset.vision && dispatcher.visionFor(id) }
}

type Route =
  | SideRoutes.Route
  | { readonly _tag: "Run"; readonly effect: Effect.Effect<unknown, unknown, GatewayServices> }
  | { readonly _tag: "Plain"; readonly start: (edge: EdgeRequest, run: PlainRun) => void }

const route = (edge: EdgeRequest, side: SideRoutes.SideRoutesShape | undefined): Route => {
  const { req, res, requestId } = edge
  const url = req.url ?? "/"
  const q = url.indexOf("?")
  const path = q < 0 ? url : url.slice(0, q)
  const method = req.method ?? "GET"
  if (path === "/v1/chat/completions") {
    return method === "POST"
      ? { _tag: "Plain", start: chatCompletionPlain }
      : { _tag: "Empty", status: 405, allow: "POST" }
  }
  if (path === "/v1/models") {
    return method === "GET" || method === "HEAD"
      ? { _tag: "Run", effect: Models.list(authenticate(edge.services.apiKeys, req), res, requestId) }
      : { _tag: "Empty", status: 405, allow: "GET" }
  }
  if (path === "/healthz" && method === "GET") {
    return { _tag: "Run", effect: Effect.sync(() => sendJson(res, 200, { status: "ok" })) }
  }
  // Outside /v1 (which keeps exactly its two routes): the admin API and pages, when present.
  if (side !== undefined && !path.startsWith("/v1/")) {
    const decided = side.route(req, res, path, edge.startedAt)
    if (decided !== undefined) return decided
  }
  return { _tag: "Empty", status: 404 }
}

/** Renders how a request failed, unless it was interrupted (the client left, or its cleanups answered). */
const render = ({ req, res, requestId }: EdgeRequest, cause: Cause.Cause<unknown>) => {
  if (Cause.isInterruptedOnly(cause)) return
  const failure = Cause.failureOption(cause)
  const error =
    Option.isSome(failure) && isApiError(failure.value)
      ? failure.value
      : new InternalError({ message: "The server failed to handle the request." })
  if (!isApiError(Option.getOrUndefined(failure))) {
    console.error(`[${requestId}] internal error`, Cause.pretty(cause))
  }
  Operations.noteError(res, error._tag === "ValidationFailed" ? "validation_failed" : error.code)
  writeError(req, res, requestId, error)
}

/**
 * The end of every request: its scope closes (permit, hold, node stream,
 * a stopped answer written), then a failure is rendered.
 */
const finish = (edge: EdgeRequest, exit: Exit.Exit<unknown, unknown>): Effect.Effect<void> => {
  const closing = Finalizers.closeNow(edge.scope, exit)
  if (closing === Effect.void && Exit.isSuccess(exit)) return Effect.void
  // An interrupted request renders nothing: the client left, or what stopped it answered.
  return Effect.descriptorWith((fiber) => closed(edge, exit, closing, HashSet.size(fiber.interruptors) > 0))
}

/** `closing` (the scope's close) run, then how the request failed rendered, unless it was interrupted. */
const closed = (
  edge: EdgeRequest,
  exit: Exit.Exit<unknown, unknown>,
  closing: Effect.Effect<void>,
  interrupted: boolean,
): Effect.Effect<void> =>
  Effect.matchCause(closing, {
    onFailure: (cause) => renderEnd(edge, exit, cause, interrupted),
    onSuccess: () => renderEnd(edge, exit, undefined, interrupted),
  })

/** How the request failed, its close's failure after it (if any); nothing for an interrupted one. */
const renderEnd = (
  edge: EdgeRequest,
  exit: Exit.Exit<unknown, unknown>,
  closeFailed: Cause.Cause<unknown> | undefined,
  interrupted: boolean,
): void => {
  if (interrupted) return
  if (Exit.isFailure(exit))
    render(edge, closeFailed === undefined ? exit.cause : Cause.sequential(exit.cause, closeFailed))
  else if (closeFailed !== undefined) render(edge, closeFailed)
}

/**
 * A chat completion run by plain calls (`chatCompletionPlain`) until a step
 * needs Effect: `done` with an `Exit` ends it here, by plain calls (its
 * scope closed, a failure rendered); `done` with any other Effect runs that
 * on a fiber of the requests' runtime, ended by `finish` as every request
 * is, and the run follows the fiber from then on. What the drain, the
 * client's close and a stopped answer act on, whichever runs it.
 */
class PlainRun implements RequestRun.RequestRun {
  private observers: Array<() => void> | undefined = []
  private fiber: Fiber.RuntimeFiber<unknown, unknown> | undefined = undefined
  private over = false
  private interrupting = false

  constructor(private readonly edge: EdgeRequest) {}

  addObserver(observer: () => void): void {
    if (this.observers === undefined) observer()
    else this.observers.push(observer)
  }

  /**
   * As a fiber's interruption, at the next turn, not inside the code running
   * now: a stop can come from within it (the drain's halt, called at once
   * once its deadline passed, from the answer's opening), and a fiber just
   * handed the rest is followed by then.
   */
  readonly interrupt = (): void => {
    if (this.fiber !== undefined) this.fiber.unsafeInterruptAsFork(FiberId.none)
    else if (!this.over && !this.interrupting) {
      this.interrupting = true
      queueMicrotask(() => {
        if (this.fiber !== undefined) this.fiber.unsafeInterruptAsFork(FiberId.none)
        else if (!this.over) this.close(Exit.interrupt(FiberId.none), true)
      })
    }
  }

  readonly done = (result: Effect.Effect<unknown, unknown, GatewayServices>): void => {
    if (this.over || this.fiber !== undefined) return
    if (Exit.isExit(result)) {
      this.close(result, false)
      return
    }
    const edge = this.edge
    const fiber = edge.services.runRequest(Effect.onExit(result, (exit) => finish(edge, exit)))
    this.fiber = fiber
    fiber.addObserver(this.ended)
  }

  /** A callback's work, unless the request ended; a throw is the request's defect, never the event loop's. */
  guarded(work: () => void): void {
    if (this.over || this.fiber !== undefined) return
    try {
      work()
    } catch (thrown) {
      this.done(Exit.die(thrown))
    }
  }

  private close(exit: Exit.Exit<unknown, unknown>, interrupted: boolean): void {
    this.over = true
    const { edge } = this
    // Plain cleanups run here; observed finalizers (scaled out: the release and the settlement, one
    // round trip) are read by callback; what needs Effect goes on a fiber, as `finish` would run it.
    let read = false
    try {
      Observed.observe(Finalizers.closeNow(edge.scope, exit), (closing) => {
        read = true
        this.closed(exit, closing, interrupted)
      })
    } catch (thrown) {
      // A throw before the close was read (a cleanup's is in `closing`): the request's defect.
      if (read) throw thrown
      this.closed(exit, Exit.die(thrown), interrupted)
    }
  }

  /** The close read: rendered as `closed` renders it, or run on a fiber where it hands on an Effect. */
  private closed(
    exit: Exit.Exit<unknown, unknown>,
    closing: Effect.Effect<void>,
    interrupted: boolean,
  ): void {
    const { edge } = this
    if (!Exit.isExit(closing)) {
      // As `finish` runs a close: not interruptibly (what it waits for is owed whatever happens).
      edge.services
        .runRequest(Effect.uninterruptible(closed(edge, exit, closing, interrupted)))
        .addObserver(this.ended)
      return
    }
    // The drain and the log hear of the end whatever rendering does.
    try {
      renderEnd(edge, exit, Exit.isFailure(closing) ? closing.cause : undefined, interrupted)
    } finally {
      this.ended()
    }
  }

  private readonly ended = (): void => {
    const observers = this.observers
    this.observers = undefined
    if (observers !== undefined) for (const observer of observers) observer()
  }
}

/**
 * The `node:http` request listener, running each request on `runtime`; with
 * `ops`, also `/readyz`, `/metrics`, the drain, metrics and request logs.
 */
export const makeListener = (runtime: Runtime.Runtime<GatewayServices>, ops?: Operations.Operations) => {
  const { context, runtimeFlags } = runtime
  // A request's failure is rendered by `finish`, not logged again by Effect as an unhandled error.
  const fiberRefs = Runtime.runSync(runtime)(
    Effect.withUnhandledErrorLogLevel(Effect.getFiberRefs, Option.none()),
  )
  // One runtime for every request. Its scope is not in its context (a copy of the context per
  // request, ~2.5 KB): it is passed down as `edge.scope`, and a read of `Scope` from the context
  // fails loudly instead of finding the server's own.
  const requests = Runtime.make({
    context: Context.omit(Scope.Scope)(context) as typeof context,
    fiberRefs,
    runtimeFlags,
  })
  const runRequest = Runtime.runFork(requests)
  const side = Option.getOrUndefined(Context.getOption(runtime.context, SideRoutes.SideRoutes))
  const services: RequestServices = {
    apiKeys: Context.get(context, ApiKeys.ApiKeys),
    config: Context.get(context, GatewayConfig),
    dispatcher: Context.get(context, Dispatcher.Dispatcher),
    limits: Context.get(context, Limits.LimitsConfig),
    quota: Context.get(context, Quota.Quota),
    billing: Context.get(context, BillingService.Billing),
    clock: Context.get(FiberRefs.getOrDefault(fiberRefs, DefaultServices.currentServices), Clock.Clock),
    runtime: requests as Runtime.Runtime<never>,
    runFork: Runtime.runFork(runtime),
    runRequest,
  }
  return (req: IncomingMessage, res: ServerResponse) => {
    const startedAt = Date.now()
    const requestId = newRequestId()
    res.setHeader(REQUEST_ID_HEADER, requestId)
    // RFC 9112 §3.2.2: a server MUST accept the absolute form of a request target; it is routed by its path.
    const target = req.url ?? "/"
    if (!target.startsWith("/")) {
      try {
        const url = new URL(target)
        req.url = `${url.pathname}${url.search}`
      } catch {
        req.url = "/"
      }
    }
    // RFC 9112 §3.2: an HTTP/1.1 request without Host is 400 (Node's own answer would carry no request id).
    if (req.headers.host === undefined && req.httpVersionMajor === 1 && req.httpVersionMinor === 1) {
      writeError(
        req,
        res,
        requestId,
        new InvalidRequest({ message: "An HTTP/1.1 request must carry a Host header.", param: null }),
      )
      return
    }
    if (ops !== undefined) {
      const url = req.url ?? "/"
      const q = url.indexOf("?")
      if (Operations.intercept(ops, req, res, requestId, startedAt, q < 0 ? url : url.slice(0, q))) return
    }
    // The request's scope, made here and passed down in `edge`: no Effect step to open it, and
    // a common request's cleanups are plain calls run by `Finalizers.closeNow` (no step to close it either).
    const scope = Finalizers.makeScopeNow()
    const edge: EdgeRequest = { req, res, requestId, startedAt, services, scope }
    let decided: Route
    try {
      decided = route(edge, side)
    } catch {
      // A malformed percent-escape in a path outside /v1.
      decided = { _tag: "Empty", status: 404 }
    }
    if (decided._tag === "Empty") {
      closeAfterUnreadBody(req, res)
      return empty(res, decided.status, decided.allow)
    }
    let run: RequestRun.RequestRun
    if (decided._tag === "Plain") {
      const plain = new PlainRun(edge)
      run = plain
      plain.guarded(() => decided.start(edge, plain))
    } else {
      run = RequestRun.ofFiber(runRequest(Effect.onExit(decided.effect, (exit) => finish(edge, exit))))
    }
    if (ops !== undefined) Operations.track(ops, run, res)
    res.on("close", () => {
      if (!res.writableFinished) run.interrupt()
    })
  }
}

export interface ListenOptions {
  readonly port: number
  readonly host: string
  /** On shutdown, how long in-flight requests may finish before their connections are closed. */
  readonly drainMillis?: number | undefined
}

/** Listens until the scope closes; closing drains the server (Drain.ts). */
export const listen = (options: ListenOptions) =>
  Effect.gen(function* () {
    const config = yield* GatewayConfig
    const runtime = yield* Effect.runtime<GatewayServices>()
    const ops = yield* Operations.make
    const server: Server = createServer(
      {
        // Our own 408 comes first; Node's limits only catch what escapes it.
        requestTimeout: config.bodyTimeoutMillis + 5_000,
        headersTimeout: Math.min(config.headersTimeoutMillis, config.bodyTimeoutMillis + 5_000),
        keepAliveTimeout: 5_000,
        connectionsCheckingInterval: Math.min(1_000, config.bodyTimeoutMillis, config.headersTimeoutMillis),
        // Checked by the listener, so that the 400 carries a request id like every answer.
        requireHostHeader: false,
      },
      makeListener(runtime, ops),
    )
    server.on("clientError", onClientError)
    server.on("checkExpectation", onUnmetExpectation)
    server.on("connect", onConnect)
    // Before the drain's release, so that streams still finishing in the drain keep the policy.
    yield* HeapPolicy.watch(() => ops.drainer.inFlight, { tightAt: config.heapTightAt })
    yield* Effect.acquireRelease(
      Effect.async<void, Error>((resume) => {
        server.once("error", (e) => resume(Effect.fail(e)))
        server.listen(options.port, options.host, () => resume(Effect.void))
      }),
      // The drain: see Drain.ts for the sequence.
      () => ops.drainer.shutdown(server, options.drainMillis ?? 10_000),
    )
    const address = server.address() as AddressInfo
    return { server, port: address.port, host: address.address }
  })
