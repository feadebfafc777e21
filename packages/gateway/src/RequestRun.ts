/**
 * What runs a request, as the drain and the client's close see it: a fiber,
 * or a chat completion run by plain calls until a step needs one
 * (HttpServer's `PlainRun`).
 */
import { type Fiber, FiberId } from "effect"

export interface RequestRun {
  /** Called once the request ended (its scope closed); at once if it has. */
  readonly addObserver: (observer: () => void) => void
  /** Ends the request as an interruption: its scope closes, nothing more is rendered. */
  readonly interrupt: () => void
}

/** A request's fiber as a `RequestRun`. */
export const ofFiber = (fiber: Fiber.RuntimeFiber<unknown, unknown>): RequestRun => ({
  addObserver: (observer) => fiber.addObserver(observer),
  interrupt: () => fiber.unsafeInterruptAsFork(FiberId.none),
})
