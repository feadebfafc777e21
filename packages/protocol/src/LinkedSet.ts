/**
 * A set of registrations that come and go once per request (a drain's halt,
 * a key's watcher, a stream's keep-alive), kept in a doubly linked list:
 * adding returns the link, removing it is O(1), and nothing is reallocated.
 *
 * Why not a `Set` or `Map`: in a long-lived one, V8 allocates a new hash
 * table whenever deletes leave it under a quarter full (each time the last
 * entry goes) or adds find it full of deleted slots — every few requests
 * under churn. The new table is allocated in the old generation when the
 * old one is there, and the old table is kept, pointing at the new one (for
 * iterators) and still holding the entries it had. Until the next
 * mark-compact those old tables keep young objects alive through every
 * scavenge: a request's closures, its fiber, its buffers are copied and
 * promoted. Measured in the gateway (BENCHMARKS.md, 2026-11-29): such tables
 * on the request path were most of what a request left to survive a scavenge.
 * A link is an ordinary young object: it dies with the request.
 */
export interface Link<A> {
  readonly value: A
  /** @internal the entry added before this one */
  prev: Link<A> | undefined
  /** @internal the entry added after this one */
  next: Link<A> | undefined
  /** @internal */
  linked: boolean
}

export class LinkedSet<A> {
  private oldest: Link<A> | undefined = undefined
  private newest: Link<A> | undefined = undefined
  private count = 0

  get size(): number {
    return this.count
  }

  /** Adds `value` (again, if it is there already: each link is its own entry). */
  add(value: A): Link<A> {
    const link: Link<A> = { value, prev: this.newest, next: undefined, linked: true }
    if (this.newest === undefined) this.oldest = link
    else this.newest.next = link
    this.newest = link
    this.count++
    return link
  }

  /** Removes the entry `link` made; a link already removed (or cleared) is left alone. */
  remove(link: Link<A>): void {
    if (!link.linked) return
    link.linked = false
    if (link.prev === undefined) this.oldest = link.next
    else link.prev.next = link.next
    if (link.next === undefined) this.newest = link.prev
    else link.next.prev = link.prev
    link.prev = undefined
    link.next = undefined
    this.count--
  }

  /** The values in the order they were added: a copy, so callers may add and remove while they go through it. */
  values(): Array<A> {
    const values: Array<A> = []
    for (let link = this.oldest; link !== undefined; link = link.next) values.push(link.value)
    return values
  }

  /** Calls `f` with each value in the order added; `f` may remove the entry it is given, not others (use `values`). */
  forEach(f: (value: A) => void): void {
    for (let link = this.oldest; link !== undefined; ) {
      const next = link.next
      f(link.value)
      link = next
    }
  }

  /** Removes every entry; their links stay removed. */
  clear(): void {
    for (let link = this.oldest; link !== undefined; ) {
      const next = link.next
      link.linked = false
      link.prev = undefined
      link.next = undefined
      link = next
    }
    this.oldest = undefined
    this.newest = undefined
    this.count = 0
  }
}
