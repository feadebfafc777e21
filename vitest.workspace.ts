// Two tiers, both run by `npm test`: `unit` runs in-process, `e2e` (`*.e2e.test.ts`) starts real
// processes (the swarmgate bundle, node-sim, nginx, PostgreSQL and Redis clients).
// `npm run test:unit` and `npm run test:e2e` run one tier.
import { defineWorkspace } from "vitest/config"

const roots = ["packages/*/test/**/", "apps/*/test/**/"]
const exclude = ["**/node_modules/**", "**/dist/**", "**/build/**"]

export default defineWorkspace([
  {
    test: {
      name: "unit",
      // Correctness, not speed: a machine busy with other work must not fail a test by the clock.
      testTimeout: 30_000,
      include: roots.map((root) => `${root}*.test.ts`),
      exclude: [...exclude, "**/*.e2e.test.ts"],
    },
  },
  {
    test: {
      name: "e2e",
      include: roots.map((root) => `${root}*.e2e.test.ts`),
      exclude,
    },
  },
])
