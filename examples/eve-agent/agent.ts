// An eve agent for use behind Iva (C9): eve's own in-turn compaction stays as a safety net,
// a quarter above Iva's parking threshold. Iva compacts between turns at
// min(60% × window, 110 000) tokens; eve compacts inside a turn only past
// min(75% × window, 137 500), i.e. thresholdPercent = min(0.75, 137 500 / window).
//
// Copy into your eve app's agent/ folder and set your own model. Keep the window here equal to
// the model's real window (Iva reads it from /eve/v1/info).
import { defineAgent } from "eve";

const contextWindowTokens = Number(process.env.EVE_CONTEXT_WINDOW ?? "200000");
const IN_TURN_CEILING = 137_500;

export default defineAgent({
  model: "anthropic/claude-sonnet-4.5", // your model
  modelContextWindowTokens: contextWindowTokens,
  compaction: {
    // 200 000 → 0.6875 (137 500 tokens); 128 000 → 0.75 (96 000); 1 000 000 → 0.1375 (137 500).
    thresholdPercent: Math.min(0.75, IN_TURN_CEILING / contextWindowTokens),
  },
});
