/**
 * The `consensus` strategy: k nodes answer, judges compare the distinct
 * answers pairwise, and the Bradley–Terry winner (votes weighted by judge
 * reputation) is returned. Rare and slow by nature, so written plainly with
 * Effect's concurrency: authors and judges are fibers, slots are scoped.
 */
import type { CapacityExhausted, UpstreamError } from "@swarmgate/protocol"
import { Chunk, Clock, Deferred, Effect, Either, ExecutionStrategy, Exit, Random, Scope } from "effect"
import { type Answer, complete, ended, modelRequest } from "../Attempt"
import * as Judging from "../Consensus"
import type { Entry, Slot } from "../NodePool"
import type { NodeEvent, NodePull, NodeRequest } from "../NodeTransport"
import type { Preset } from "../Presets"
import { capacityExhausted, type NodeRun, runOf, type StrategyContext } from "./Strategy"

/** A judge's slot on one given node if it is free now, held by the current scope. */
const claimOn = (ctx: StrategyContext, entry: Entry): Effect.Effect<Slot | undefined, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.map(Clock.currentTimeMillis, (now) => ctx.pool.claimOn(entry, now)),
    (slot) => (slot === undefined ? Effect.void : Effect.sync(() => ctx.pool.release(slot))),
  )

export const consensus = (
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
): Effect.Effect<NodeRun, CapacityExhausted | UpstreamError, Scope.Scope> =>
  Effect.gen(function* () {
    const params = preset.consensus
    const parent = yield* Effect.scope
    const vision = request.messages.some((m) => m.images.length > 0)
    const tried = new Set<string>()
    const answers: Array<Answer> = []
    const quorum = yield* Deferred.make<void>()
    const startedAt = yield* Clock.currentTimeMillis

    // An author answers on its node; one failing is replaced by an untried node while attempts last.
    const author = (slot: Slot, scope: Scope.CloseableScope): Effect.Effect<void> =>
      Effect.gen(function* () {
        let current: { slot: Slot; scope: Scope.CloseableScope } | undefined = { slot, scope }
        for (let attempt = 1; current !== undefined; attempt++) {
          const result = yield* Effect.either(
            complete(
              current.slot,
              modelRequest(current.slot.entry, preset, request, ctx.attempt.idleTimeoutMillis),
              ctx.attempt,
            ),
          ).pipe(Effect.ensuring(Scope.close(current.scope, Exit.void)))
          if (Either.isRight(result)) {
            answers.push(result.right)
            if (answers.length >= Math.min(params.quorum, params.k))
              yield* Deferred.succeed(quorum, undefined)
            return
          }
          current = undefined
          if (attempt >= ctx.maxAttempts) return
          const child = yield* Scope.fork(parent, ExecutionStrategy.sequential)
          const next = yield* Scope.extend(ctx.pool.acquire(preset.id, tried, vision, 0), child)
          if (next === undefined) yield* Scope.close(child, Exit.void)
          else {
            tried.add(next.entry.node.id)
            current = { slot: next, scope: child }
          }
        }
      })

    // The first author may wait in the queue; the others take what is free now.
    const slots: Array<{ slot: Slot; scope: Scope.CloseableScope }> = []
    for (let i = 0; i < params.k; i++) {
      const child = yield* Scope.fork(parent, ExecutionStrategy.sequential)
      const slot = yield* Scope.extend(
        ctx.pool.acquire(preset.id, tried, vision, i === 0 ? ctx.queueWaitMillis : 0),
        child,
      )
      if (slot === undefined) {
        yield* Scope.close(child, Exit.void)
        break
      }
      tried.add(slot.entry.node.id)
      slots.push({ slot, scope: child })
    }
    if (slots.length === 0) return yield* Effect.fail(capacityExhausted(ctx, preset))

    const all = Effect.forEach(slots, ({ scope, slot }) => author(slot, scope), {
      concurrency: "unbounded",
      discard: true,
    })
    // Past the deadline, a quorum is enough: the stragglers are cancelled.
    const deadline = Effect.zipRight(
      Effect.sleep(Math.max(0, startedAt + params.deadlineMillis - (yield* Clock.currentTimeMillis))),
      Deferred.await(quorum),
    )
    yield* Effect.race(all, deadline)
    if (answers.length === 0) {
      // No author produced an answer: nothing was generated, which is capacity (429), not 502.
      return yield* Effect.fail(capacityExhausted(ctx, preset, yield* Clock.currentTimeMillis))
    }
    const collected = [...answers]
    const authors = collected.map((a) => a.nodeId)
    // Ranked on the first pull, with the judges' slots held only while they judge.
    let ranked = false
    const pull: NodePull = Effect.suspend(() => {
      if (ranked) return ended
      ranked = true
      return Effect.map(Effect.scoped(rank(ctx, preset, request, collected)), (winner) =>
        Chunk.unsafeFromArray([...winner.events]),
      )
    })
    return runOf(`consensus:${authors.join(",")}`, pull)
  })

/** Judges compare the distinct answers pairwise; the Bradley–Terry winner is returned. */
const rank = (
  ctx: StrategyContext,
  preset: Preset,
  request: Omit<NodeRequest, "model">,
  answers: ReadonlyArray<Answer>,
) =>
  Effect.gen(function* () {
    const candidates: Array<{ text: string; events: ReadonlyArray<NodeEvent>; authors: Array<string> }> = []
    for (const answer of answers) {
      const same = candidates.find((c) => c.text === answer.text)
      if (same !== undefined) same.authors.push(answer.nodeId)
      else candidates.push({ text: answer.text, events: answer.events, authors: [answer.nodeId] })
    }
    const lastUser = [...request.messages].reverse().find((m) => m.role === "user") ?? request.messages.at(-1)
    const question = lastUser?.content ?? ""
    const reputations: Record<string, number> = {}
    const votes: Array<Judging.Vote> = []
    let strengths = candidates.map(() => 1)

    if (candidates.length > 1) {
      const authorIds = new Set(answers.map((a) => a.nodeId))
      // Judges are picked from nodes without an answer in the running where possible.
      const pool = yield* Effect.map(Clock.currentTimeMillis, (now) =>
        ctx.pool.serving(preset.id).filter((e) => ctx.pool.free(e, now)),
      )
      const outsiders = pool.filter((e) => !authorIds.has(e.node.id))
      const insiders = pool.filter((e) => authorIds.has(e.node.id))
      const shuffled = [...(yield* Random.shuffle(outsiders)), ...(yield* Random.shuffle(insiders))]
      const judges: Array<Slot> = []
      for (const entry of shuffled) {
        if (judges.length >= preset.consensus.judges) break
        const slot = yield* claimOn(ctx, entry)
        if (slot !== undefined) judges.push(slot)
      }
      for (const judge of judges) reputations[judge.entry.node.id] = judge.entry.health.reputation
      const pairs: Array<readonly [number, number]> = []
      for (let i = 0; i < candidates.length; i++)
        for (let j = i + 1; j < candidates.length; j++) pairs.push([i, j])

      yield* Effect.forEach(
        judges,
        (judge, n) =>
          Effect.gen(function* () {
            for (const [i, j] of yield* Random.shuffle(pairs)) {
              // Either order, at random: a judge with a position bias gains nothing from it.
              const swap = yield* Random.nextBoolean
              const [a, b] = swap ? [j, i] : [i, j]
              const verdict = yield* Effect.either(
                complete(
                  judge,
                  {
                    requestId: `${request.requestId}-judge-${n}`,
                    model: judge.entry.node.models.get(preset.id) ?? preset.id,
                    messages: Judging.judgeMessages(question, candidates[a]!.text, candidates[b]!.text),
                    maxTokens: 8,
                    jsonMode: false,
                    sampling: { temperature: 0 },
                  },
                  ctx.attempt,
                  ctx.judgeTimeoutMillis,
                ),
              )
              if (Either.isLeft(verdict)) return
              const choice = Judging.parseVerdict(verdict.right.text)
              if (choice === undefined) continue
              votes.push({
                judge: judge.entry.node.id,
                winner: choice === "A" ? a : b,
                loser: choice === "A" ? b : a,
                weight: Judging.weightOf(judge.entry.health.reputation),
              })
            }
          }),
        { concurrency: "unbounded", discard: true },
      )
      strengths = Judging.bradleyTerry(candidates.length, votes)
      for (const [judge, { agreed, total }] of Judging.agreement(candidates.length, votes)) {
        const entry = ctx.pool.entries.get(judge)
        if (entry !== undefined)
          entry.health.reputation = Judging.updateReputation(entry.health.reputation, agreed, total)
      }
    }

    // Without votes, trust the authors' standing.
    const standing = (c: (typeof candidates)[number]) =>
      Math.max(...c.authors.map((id) => ctx.pool.entries.get(id)?.health.reputation ?? 0))
    const scores =
      votes.length > 0
        ? strengths.map((s, i) => s + standing(candidates[i]!) * 1e-6)
        : candidates.map(standing)
    const winner = Judging.argmax(scores)
    ctx.onConsensus?.({
      requestId: request.requestId,
      presetId: preset.id,
      question,
      answers: answers.map((a) => ({ nodeId: a.nodeId, text: a.text })),
      candidates: candidates.map((c, i) => ({ text: c.text, authors: c.authors, strength: strengths[i]! })),
      votes,
      winner,
      reputations,
    })
    return candidates[winner]!
  })
