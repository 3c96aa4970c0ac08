// Which provider serves a model id. The template hands eve the id as it is: an AI Gateway id
// ("anthropic/claude-sonnet-4.5"), called through AI Gateway with the credentials eve has.
// Replace this one function to serve the ids another way, for example a local OpenAI-compatible
// server through @ai-sdk/openai-compatible (tests/process/test_example_agent.py does that with
// its scripted model), or a provider package per id prefix.
import type { LanguageModel } from "ai";

export function languageModel(id: string): string | LanguageModel {
  return id;
}
