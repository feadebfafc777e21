/**
 * Keeps this process's nodes registered with a gateway (`POST /admin/v1/nodes`)
 * while it runs, and drains them (`DELETE`) when it stops.
 */
import type { ServedNode } from "./NodeServer"

export interface Registration {
  /** Drains every node at the gateway and stops renewing. */
  readonly stop: () => Promise<void>
}

const call = async (url: string, token: string | undefined, method: string, body?: unknown) => {
  const response = await fetch(url, {
    method,
    headers: {
      "content-type": "application/json",
      ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
    },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  await response.arrayBuffer()
  return response.status
}

export const register = (
  gateway: string,
  token: string | undefined,
  nodes: ReadonlyArray<ServedNode>,
  ttlMillis: number,
  log: (line: Record<string, unknown>) => void,
): Registration => {
  const base = `${gateway.replace(/\/+$/, "")}/admin/v1/nodes`
  const renew = async () => {
    for (const node of nodes) {
      try {
        const status = await call(base, token, "POST", { ...node, ttl_ms: ttlMillis })
        if (status >= 300) log({ event: "register_failed", node: node.id, status })
      } catch (error) {
        log({ event: "register_failed", node: node.id, error: String((error as Error).message) })
      }
    }
  }
  // A third of the lifetime: two renewals may be lost before the gateway lets the nodes expire.
  const timer = setInterval(renew, Math.max(100, Math.floor(ttlMillis / 3)))
  void renew()
  return {
    stop: async () => {
      clearInterval(timer)
      await Promise.all(
        nodes.map((node) => call(`${base}/${encodeURIComponent(node.id)}`, token, "DELETE").catch(() => 0)),
      )
    },
  }
}
