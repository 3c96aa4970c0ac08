// An eve agent for use behind Iva, for eve 1.x (built and served against eve 1.0.1 by
// tests/process/test_example_agent.py). Copy this file into your eve app's agent/ folder, with
// channels/eve.ts, connections/notebook.ts, lib/, tools/ and, if you want it, schedules/morning-brief.ts.
//
// The model is chosen per chat (D1): Iva's /model lets a chat's owner pick one of the models the
// operator allows in IVA_MODELS, and Iva names it on every request (x-iva-model, read by
// channels/eve.ts after it checked Iva's bearer). Set IVA_MODELS where eve runs to the same value
// as Iva's ("fast=openai/gpt-5-mini:400000,strong=anthropic/claude-sonnet-4.5:200000": name, eve's
// model id, its context window; the first is the default). Without it, lib/iva.ts's DEFAULT_MODEL
// answers with EVE_CONTEXT_WINDOW as its window. lib/provider.ts says which provider serves an id.
import { defineAgent, defineDynamic } from "eve";
import { allowedModels, chooseModel, iva } from "./lib/iva";
import { languageModel } from "./lib/provider";

// C9: eve's own in-turn compaction stays as a safety net, a quarter above Iva's parking
// threshold. Iva compacts between turns at min(60% × window, 110 000) tokens of the chat's
// model's window; eve compacts inside a turn only past min(75% × window, 137 500), i.e. threshold
// = min(0.75, 137 500 / window). eve takes one fraction for every model, so it is the smallest
// allowed window's: exact for that model, later (still under the window) for bigger ones.
// 200 000 → 0.6875 (137 500 tokens); 128 000 → 0.75 (96 000); 1 000 000 → 0.1375 (137 500).
// IVA_MODELS (or EVE_CONTEXT_WINDOW) is read here when eve builds: rebuild when it changes.
const IN_TURN_CEILING = 137_500;
const smallestWindow = Math.min(...allowedModels().map((m) => m.window));

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
  // D1, D3: the chat's model, chosen once per turn (memoised on the turn: a turn keeps one model
  // and its prompt cache even when a steer arrives), from the allow-list only: an id Iva did not
  // allow, or no header (a caller other than Iva), gets the first model, never a failed turn.
  // Each selection carries its own window; eve's /info then names no model and no window (Iva
  // takes the windows from its own IVA_MODELS).
  model: defineDynamic(async (ctx) => {
    const chosen = await ctx.memo(["iva-model", ctx.turn?.id ?? null], async () => chooseModel(iva(ctx).model));
    return { model: languageModel(chosen.id), modelContextWindowTokens: chosen.window };
  }),
  // eve's default tools (bash and the file tools need a sandbox; web_fetch, web_search, agent)
  // would be offered to every turn, the notebook's rebuild included, and a dynamic tool cannot
  // take a static one away. So the template has none of its own making: tools/everyday.ts offers
  // what a turn may use, and nothing to the rebuild (D4).
  defaultTools: false,
  compaction: {
    // eve 1.x name; eve 0.80.x called the same fraction `thresholdPercent`, which 1.x refuses.
    threshold: Math.min(0.75, IN_TURN_CEILING / smallestWindow),
  },
  limits: {
    // New input only: cache reads replay history the provider already holds.
    sessionUsage: ({ window }) =>
      window.inputTokens - window.cacheReadTokens >= NEW_INPUT_TOKENS_PER_WINDOW,
  },
});
