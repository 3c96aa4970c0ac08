// An eve agent for use behind Iva, for eve 1.x (built and served against eve 1.0.1 by
// tests/process/test_example_agent.py). Copy this file into your eve app's agent/ folder, with
// channels/eve.ts, connections/notebook.ts and, if you want it, schedules/morning-brief.ts.
//
// Set your own model on the `model:` line, and keep the window here equal to the model's real
// window: Iva reads it from /eve/v1/info (which answers Iva only through channels/eve.ts) and
// parks each chat's conversation against it. eve reads EVE_CONTEXT_WINDOW when it builds.
import { defineAgent } from "eve";

const contextWindowTokens = Number(process.env.EVE_CONTEXT_WINDOW ?? "200000");

// C9: eve's own in-turn compaction stays as a safety net, a quarter above Iva's parking
// threshold. Iva compacts between turns at min(60% × window, 110 000) tokens; eve compacts inside
// a turn only past min(75% × window, 137 500), i.e. threshold = min(0.75, 137 500 / window).
// 200 000 → 0.6875 (137 500 tokens); 128 000 → 0.75 (96 000); 1 000 000 → 0.1375 (137 500).
const IN_TURN_CEILING = 137_500;

// The session budget. eve's default pauses a session once a usage window (everything since the
// last approved continuation) has taken 40 million new input tokens, and asks Approve / Stop: a
// guard against a defective session that loops. Behind Iva a Telegram chat is one eve session for
// months, compacted between turns, so the window only grows with ordinary use: a busy chat
// (say 100 turns a day of a few model calls each, 30 000–100 000 new input tokens a call when the
// provider caches little) spends 40 million in weeks, and the person would be stopped by a guard
// meant for a runaway. So the limit is set well above a month of such use, 200 million new input
// tokens a window, and the guard stays: a turn that loops still meets it (Iva shows the prompt to
// the chat's owner with Continue / Stop, V6; Continue starts a new window). We do not switch it off
// (`sessionUsage: false`): Iva's busy timeout bounds how long a turn may run, not what it spends.
// Lower it for an expensive model; with AI Gateway you can also bound `window.costUsd`.
const NEW_INPUT_TOKENS_PER_WINDOW = 200_000_000;

export default defineAgent({
  model: "anthropic/claude-sonnet-4.5", // your model
  modelContextWindowTokens: contextWindowTokens,
  compaction: {
    // eve 1.x name; eve 0.80.x called the same fraction `thresholdPercent`, which 1.x refuses.
    threshold: Math.min(0.75, IN_TURN_CEILING / contextWindowTokens),
  },
  limits: {
    // New input only: cache reads replay history the provider already holds.
    sessionUsage: ({ window }) =>
      window.inputTokens - window.cacheReadTokens >= NEW_INPUT_TOKENS_PER_WINDOW,
  },
});
