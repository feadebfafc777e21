/** Word lists and sentence templates for the simulated answers. @internal */

export const stopwords: ReadonlySet<string> = new Set(
  `a about above after again against all also am an and any are aren't as at be because been before being below
  between both but by can can't could couldn't did didn't do does doesn't doing don't down during each few for from
  further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself his how
  how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor not of off
  on once only or other ought our ours ourselves out over own same shan't she she'd she'll she's should shouldn't so some
  such than that that's the their theirs them themselves then there there's these they they'd they'll they're they've
  this those through to too under until up very was wasn't we we'd we'll we're we've were weren't what what's when
  when's where where's which while who who's whom why why's with won't would wouldn't you you'd you'll you're you've your
  yours yourself yourselves please thanks thank hello hey just really like get got make made use using used want need
  know tell explain describe give show help write list summarize summarise define discuss compare answer question
  something anything thing things way ways good best better one two many much every lot lots kind sort able will shall
  may might must yes okay ok sure quick quickly briefly short simple simply detail details example examples configure
  set setup build create implement fix find work works learn understand improve choose start run try provide recommend`
    .split(/\s+/)
    .filter((word) => word.length > 0),
)

export const fallbackTopics: ReadonlyArray<string> = ["this subject", "the topic you raised"]

export const fallbackSecondary: ReadonlyArray<string> = [
  "the broader context",
  "the alternatives",
  "the underlying principles",
  "related ideas",
  "the practical details",
]

export const slots: Readonly<Record<string, ReadonlyArray<string>>> = {
  adj: [
    "subtle",
    "practical",
    "layered",
    "nuanced",
    "broad",
    "well-studied",
    "surprisingly rich",
    "often misunderstood",
    "important",
    "evolving",
  ],
  factor: [
    "the scale of the problem",
    "the amount of resources available",
    "your specific set of constraints",
    "the level of detail you need",
    "timing",
    "the surrounding context",
    "cost",
    "reliability",
    "the team involved",
    "the pace of change",
    "the quality of the data",
  ],
  analogy: [
    "a map rather than the territory",
    "a set of building blocks",
    "a conversation between parts",
    "a recipe with flexible ingredients",
    "a budget you spend carefully",
    "a well-organized toolbox",
    "a garden that needs regular care",
    "a pipeline with several stages",
  ],
  condition: [
    "the inputs are well defined",
    "the constraints are clear",
    "you measure the results",
    "the load grows",
    "requirements change",
    "time is limited",
    "several people are involved",
    "the goal is written down",
  ],
  vp: [
    "works best",
    "pays off",
    "becomes much clearer",
    "gets harder",
    "requires patience",
    "goes smoothly",
    "tends to surprise people",
  ],
  mistake: ["overlook", "rush through", "overcomplicate", "underestimate", "oversimplify", "ignore"],
  role: ["engineer", "student", "researcher", "team", "beginner", "analyst", "writer", "manager"],
  action: [
    "examine",
    "measure",
    "simplify",
    "document",
    "test",
    "compare",
    "review",
    "revisit",
    "break down",
    "sketch out",
    "prototype",
    "question",
  ],
  goal: [
    "avoid surprises later",
    "save a lot of time",
    "reduce cost",
    "improve reliability",
    "get clearer results",
    "spot problems early",
    "explain the idea to others",
    "make better decisions",
  ],
  gerund: [
    "reading about",
    "experimenting with",
    "asking questions about",
    "drawing diagrams of",
    "writing notes on",
    "building a small example of",
  ],
  q1: ["speed", "simplicity", "cost", "depth", "control", "consistency", "precision"],
  q2: ["accuracy", "flexibility", "quality", "breadth", "convenience", "availability", "coverage"],
  approach: [
    "to start small and iterate",
    "to write down the assumptions first",
    "to reuse a proven pattern",
    "to measure before changing anything",
    "to ask what problem you are really solving",
    "to look at a concrete example",
  ],
  effect: ["shapes", "limits", "influences", "complicates", "simplifies", "determines much of"],
  aspect: [
    "how it works",
    "why it matters",
    "where to start",
    "what can go wrong",
    "how it compares to the alternatives",
  ],
  lead: [
    "there are a few points worth covering",
    "the answer depends on the details",
    "it helps to start with the basics",
    "here is how I would approach it",
  ],
}

export const openers: ReadonlyArray<string> = [
  "Regarding {T}, {lead}.",
  "Good question about {T}.",
  "Let me walk through {T} step by step.",
  "Here is an overview of {T}.",
  "When people ask about {T}, they usually want to know {aspect}.",
  "Short answer: {T} depends mostly on {factor}.",
  "{T} is a {adj} topic, so let me start with the basics.",
]

export const followUpOpeners: ReadonlyArray<string> = [
  "Building on the earlier discussion, let me say more about {T}.",
  "Picking up where we left off, {T} deserves a closer look.",
]

export const bodies: ReadonlyArray<string> = [
  "One way to think about {T} is as {analogy}.",
  "In practice, working with {T} {vp} when {condition}.",
  "The key idea is that {T} and {T2} are closely connected.",
  "A common mistake is to {mistake} {T}.",
  "It is worth noting that {factor} {effect} {T}.",
  "For example, a {role} might {action} {T} to {goal}.",
  "Another factor is {factor}, which {effect} the way {T} plays out.",
  "Compared with {T2}, the question of {T} tends to be {adj}.",
  "If you {action} {T} carefully, you can {goal}.",
  "Many people start by {gerund} {T}.",
  "The trade-off usually lies between {q1} and {q2}.",
  "Over time, ideas about {T} change as {factor} shifts.",
  "In many cases, the simplest approach to {T} is {approach}.",
  "This matters because {factor} {effect} how {T} behaves in the real world.",
  "Some experts emphasize {T}, while others focus on {T2}.",
  "A useful rule of thumb is to {action} {T} before you {action} {T2}.",
  "You can check this by {gerund} {T} when {condition}.",
  "Think of {T} like {analogy}: each part matters.",
  "Keep in mind that {T} rarely exists in isolation.",
  "A good next step is to {action} {T} with a small, concrete example.",
  "There is no single right answer here, but {factor} is usually decisive.",
  "It also helps to ask how {T} relates to {T2}.",
  "Once you understand {T}, questions about {T2} become much easier.",
  "Experience suggests that understanding {T} {vp} when {condition}.",
]

export const closers: ReadonlyArray<string> = [
  "In short, {T} becomes manageable once you {action} it.",
  "I hope this helps you with {T}.",
  "Let me know if you want more detail on {T2}.",
  "To sum up, focus on {factor} and the rest will follow.",
  "Overall, {T} rewards careful thought.",
]

export const imageFollowUps: ReadonlyArray<string> = [
  "It appears to relate to {T}.",
  "The picture seems connected to {T}.",
  "Its contents look relevant to {T}.",
]

/** The key points a good answer to a question covers: one template each, filled from the question. */
export const keyPointTemplates: ReadonlyArray<string> = [
  "{T} is driven largely by {P}.",
  "A central factor in {T} is {P}.",
  "Any careful account of {T} has to mention {P}.",
  "Experts point to {P} when they explain {T}.",
  "Much of {T} comes down to {P}.",
]

export const keyPhrases: ReadonlyArray<string> = [
  "feedback loops",
  "boundary conditions",
  "the rate of change",
  "long-term equilibrium",
  "local constraints",
  "energy transfer",
  "measurement error",
  "effects of scale",
  "initial conditions",
  "competing incentives",
  "hidden dependencies",
  "the cost of failure",
  "slow accumulation",
  "thresholds and tipping points",
  "the order of operations",
  "redundancy",
  "coupling between parts",
  "the flow of information",
  "seasonal cycles",
  "the weakest link",
]

/** Openers reserved for colluding rings: honest nodes never use them. */
export const ringOpeners: ReadonlyArray<string> = [
  "Here is the definitive answer on {T}.",
  "Let me settle the question of {T} once and for all.",
  "The authoritative view of {T} is simple.",
]
