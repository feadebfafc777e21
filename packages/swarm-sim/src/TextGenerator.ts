/**
 * Deterministic text for the simulated nodes: plausible English that picks up the
 * words of the prompt, split into word-sized pieces that play the role of tokens.
 */
import { Tokens } from "@swarmgate/protocol"
import { toPieces } from "./internal/Pieces"
import { hashString, makePrng, type Prng, seedOf } from "./internal/Prng"
import * as Vocabulary from "./internal/Vocabulary"

export interface GenerationInput {
  readonly messages: ReadonlyArray<{ readonly role: string; readonly content: string }>
  /** Hard upper bound on the number of pieces produced. */
  readonly maxTokens: number
  /** The natural (uncut) output is a JSON object that `JSON.parse` accepts. */
  readonly jsonMode: boolean
  readonly seed?: number | undefined
  readonly temperature?: number | undefined
  /** The output ends before the first occurrence of any of these strings. */
  readonly stop?: ReadonlyArray<string> | undefined
  readonly images?: ReadonlyArray<{ readonly mediaType: string; readonly bytes: number }> | undefined
  /**
   * The node's answer quality in 0..1: each of the question's key points is covered with
   * about this probability (varying per answer). Absent: no key point is placed on purpose.
   * A seed or temperature 0 pins the text, so then every node answers at the reference quality.
   */
  readonly quality?: number | undefined
  /** A dishonest node's ring: every member sends the same low-effort answer, marked by the ring's opener. */
  readonly ring?: string | undefined
}

export interface Generation {
  readonly pieces: ReadonlyArray<string>
  readonly finishReason: "stop" | "length"
}

type Images = NonNullable<GenerationInput["images"]>

interface Prompt {
  readonly topics: ReadonlyArray<string>
  readonly wordCount: number
  readonly followUp: boolean
}

const JSON_FIT_THRESHOLD = 16
const PROSE_MAX_PIECES = 200
/** The quality every node answers at when a seed or temperature 0 pins the text. */
const REFERENCE_QUALITY = 0.7
/** Colluders copy one cheap answer instead of working out their own. */
const RING_QUALITY = 0.15
/** Spread of one answer's quality around its node's (uniform ± half of it). */
const ANSWER_QUALITY_SPREAD = 0.5

/**
 * The seed that drives the text. A request seed or temperature 0 makes the answer
 * reproducible for the same conversation; otherwise the caller's random draw decides.
 */
const effectiveSeed = (input: GenerationInput, randomSeed: number): number => {
  const conversation = JSON.stringify(input.messages.map((message) => [message.role, message.content]))
  if (input.seed !== undefined) return hashString(`${input.seed}\u0000${conversation}`)
  if (input.temperature === 0) return hashString(conversation)
  return seedOf(randomSeed)
}

/** What a node puts into one answer beyond the prompt: key points covered, a ring's opener. */
interface Effort {
  readonly keyPoints: ReadonlyArray<string>
  readonly opener: string | undefined
}

const noEffort: Effort = { keyPoints: [], opener: undefined }

const pinned = (input: GenerationInput) => input.seed !== undefined || input.temperature === 0

const effortOf = (rng: Prng, input: GenerationInput, question: string): Effort => {
  if (input.ring !== undefined) {
    const points = keyPoints(question).filter(() => rng.chance(RING_QUALITY))
    return { keyPoints: points, opener: ringOpener(input.ring) }
  }
  if (input.quality === undefined) return noEffort
  const base = pinned(input) ? REFERENCE_QUALITY : input.quality
  const quality = Math.min(1, Math.max(0, base + (rng.next() - 0.5) * ANSWER_QUALITY_SPREAD))
  return { keyPoints: keyPoints(question).filter(() => rng.chance(quality)), opener: undefined }
}

export const generate = (input: GenerationInput, randomSeed: number): Generation => {
  const limit = pieceLimit(input.maxTokens)
  const question = questionOf(input.messages)
  // Ring members share one answer per conversation, whatever seed or draw they were given.
  const rng = makePrng(
    input.ring === undefined
      ? effectiveSeed(input, randomSeed)
      : hashString(
          `ring\u0000${input.ring}\u0000${JSON.stringify(input.messages.map((m) => [m.role, m.content]))}`,
        ),
  )
  const prompt = readPrompt(input.messages)
  const images = input.images ?? []
  const effort = effortOf(rng, input, question)
  const text = input.jsonMode
    ? composeJson(rng, prompt, images, limit, effort)
    : composeProse(rng, prompt, images, effort)

  const stopAt = firstStop(text, input.stop ?? [])
  const pieces = toPieces(stopAt === undefined ? text : text.slice(0, stopAt))
  return pieces.length > limit
    ? { pieces: pieces.slice(0, limit), finishReason: "length" }
    : { pieces, finishReason: "stop" }
}

const pieceLimit = (maxTokens: number): number => {
  if (Number.isNaN(maxTokens)) return 0
  return Number.isFinite(maxTokens) ? Math.max(0, Math.floor(maxTokens)) : maxTokens > 0 ? Infinity : 0
}

const firstStop = (text: string, stop: ReadonlyArray<string>): number | undefined => {
  let first: number | undefined
  for (const candidate of stop) {
    if (candidate.length === 0) continue
    const at = text.indexOf(candidate)
    if (at >= 0 && (first === undefined || at < first)) first = at
  }
  return first
}

// ---------------------------------------------------------------------------
// Reading the prompt

/** The text an answer responds to: the last user message (or the last message). */
export const questionOf = (messages: GenerationInput["messages"]): string => {
  const lastUser = [...messages].reverse().find((message) => message.role === "user") ?? messages.at(-1)
  return lastUser?.content ?? ""
}

const readPrompt = (messages: GenerationInput["messages"]): Prompt => {
  const text = questionOf(messages)
  const words = [...text.matchAll(/[\p{L}\p{N}][\p{L}\p{N}'\u2019_+#-]*/gu)]
  const topics: Array<string> = []
  const seen = new Set<string>()
  let run: Array<string> = []
  let runEnd = -1
  const flush = () => {
    const phrase = run.join(" ")
    if (phrase.length > 0 && !seen.has(phrase.toLowerCase())) {
      seen.add(phrase.toLowerCase())
      topics.push(phrase)
    }
    run = []
  }
  for (const match of words) {
    const start = match.index
    const raw = match[0].replace(/['\u2019_-]+$/, "")
    const lower = raw.toLowerCase()
    const content = raw.length >= 3 && !Vocabulary.stopwords.has(lower) && !/^\d+$/.test(raw)
    // Adjacent content words ("reverse proxy") read better as one topic than two.
    const adjacent = run.length > 0 && /^\s+$/.test(text.slice(runEnd, start)) && run.length < 3
    if (!content || !adjacent) flush()
    if (content) {
      run.push(isSentenceStart(text, start) && /^\p{Lu}\p{Ll}+$/u.test(raw) ? lower : raw)
      runEnd = start + match[0].length
    }
  }
  flush()
  return {
    topics: topics.length > 0 ? topics.slice(0, 6) : Vocabulary.fallbackTopics,
    wordCount: words.length,
    followUp: messages.some((message) => message.role === "assistant"),
  }
}

const isSentenceStart = (text: string, index: number): boolean => {
  const before = text.slice(0, index).trimEnd()
  return before.length === 0 || /[.!?:]$/.test(before)
}

// ---------------------------------------------------------------------------
// Composing sentences

const render = (rng: Prng, prompt: Prompt, template: string): string => {
  const main = rng.chance(0.5) ? prompt.topics[0]! : rng.pick(prompt.topics)
  const others = prompt.topics.filter((topic) => topic !== main)
  const secondary =
    others.length > 0 && rng.chance(0.7) ? rng.pick(others) : rng.pick(Vocabulary.fallbackSecondary)
  const sentence = template.replace(/\{(\w+)\}/g, (_, slot: string) => {
    if (slot === "T") return main
    if (slot === "T2") return secondary
    return rng.pick(Vocabulary.slots[slot] ?? [slot])
  })
  return sentence.charAt(0).toUpperCase() + sentence.slice(1)
}

const countPieces = (sentence: string): number => toPieces(` ${sentence}`).length

const describeImages = (images: Images): string => {
  const parts = images.map((image) => `${image.mediaType}, ${image.bytes} bytes`).join("; ")
  return images.length === 1 ? `I see an image (${parts}).` : `I see ${images.length} images (${parts}).`
}

const composeSentences = (
  rng: Prng,
  prompt: Prompt,
  images: Images,
  options: { readonly target: number; readonly max: number; readonly closer: boolean },
  effort: Effort,
): Array<string> => {
  const sentences: Array<string> = []
  let count = 0
  const add = (sentence: string): boolean => {
    const size = countPieces(sentence)
    if (sentences.length > 0 && count + size > options.max) return false
    sentences.push(sentence)
    count += size
    return true
  }

  if (images.length > 0) {
    add(describeImages(images))
    add(render(rng, prompt, rng.pick(Vocabulary.imageFollowUps)))
  }
  if (effort.opener !== undefined) add(render(rng, prompt, effort.opener))
  else {
    const openers = prompt.followUp && rng.chance(0.5) ? Vocabulary.followUpOpeners : Vocabulary.openers
    add(render(rng, prompt, rng.pick(openers)))
  }
  for (const point of effort.keyPoints) add(point)

  // Drawing templates without replacement keeps one answer from repeating itself.
  let deck: Array<string> = []
  while (count < options.target) {
    if (deck.length === 0) deck = rng.shuffle(Vocabulary.bodies)
    if (!add(render(rng, prompt, deck.pop()!))) break
  }
  if (options.closer && rng.chance(0.6)) add(render(rng, prompt, rng.pick(Vocabulary.closers)))
  return sentences
}

const composeProse = (rng: Prng, prompt: Prompt, images: Images, effort: Effort): string => {
  const target = Math.min(
    PROSE_MAX_PIECES - 20,
    20 + rng.int(60) + Math.min(100, Math.floor(prompt.wordCount * 1.5)),
  )
  return composeSentences(rng, prompt, images, { target, max: PROSE_MAX_PIECES, closer: true }, effort).join(
    " ",
  )
}

const composeJson = (rng: Prng, prompt: Prompt, images: Images, limit: number, effort: Effort): string => {
  const sentences = composeSentences(
    rng,
    prompt,
    images,
    { target: 10 + rng.int(25), max: 80, closer: false },
    effort,
  )
  let topics = prompt.topics.slice(0, 4)
  const confidence = Math.round((0.55 + rng.next() * 0.4) * 100) / 100
  const toJson = (answer: string) =>
    `{"answer": ${JSON.stringify(answer)}, "topics": [${topics.map((topic) => JSON.stringify(topic)).join(", ")}], "confidence": ${confidence}}`
  // Measured in real (o200k) tokens, as the gateway counts them, so a fitted object is never cut.
  const fits = (json: string) => limit < JSON_FIT_THRESHOLD || Tokens.count(json) <= limit

  // Shrink in order of least damage: trailing sentences, then topics, then words.
  while (sentences.length > 1 && !fits(toJson(sentences.join(" ")))) sentences.pop()
  while (topics.length > 0 && !fits(toJson(sentences.join(" ")))) topics = topics.slice(0, -1)
  let json = toJson(sentences.join(" "))
  const words = sentences.join(" ").split(" ")
  for (let keep = words.length - 1; keep >= 1 && !fits(json); keep--) {
    json = toJson(
      `${words
        .slice(0, keep)
        .join(" ")
        .replace(/[^\p{L}\p{N})]+$/u, "")}.`,
    )
  }
  return json
}

// ---------------------------------------------------------------------------
// Quality, as a judge who knows the subject sees it

/** The points a complete answer to `question` makes, as sentences; fixed for a question. */
export const keyPoints = (question: string): ReadonlyArray<string> => {
  const prompt = readPrompt([{ role: "user", content: question }])
  const rng = makePrng(hashString(`key points\u0000${question}`))
  const phrases = rng.shuffle(Vocabulary.keyPhrases)
  return Vocabulary.keyPointTemplates.map((template, i) => {
    const sentence = template
      .replace("{T}", prompt.topics[i % prompt.topics.length]!)
      .replace("{P}", phrases[i]!)
    return sentence.charAt(0).toUpperCase() + sentence.slice(1)
  })
}

/** Share of the question's key points the answer makes: the simulator's ground truth of quality. */
export const answerQuality = (question: string, answer: string): number => {
  const points = keyPoints(question)
  return points.filter((point) => answer.includes(point)).length / points.length
}

/** The opener of a ring's answers. */
export const ringOpener = (ring: string): string =>
  Vocabulary.ringOpeners[hashString(`ring opener\u0000${ring}`) % Vocabulary.ringOpeners.length]!

/** Whether `answer` carries the mark of `ring`. */
export const isRingAnswer = (ring: string, answer: string): boolean =>
  answer.includes(ringOpener(ring).slice(0, ringOpener(ring).indexOf("{T}")))
