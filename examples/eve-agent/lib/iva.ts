// What Iva tells this agent with each request, and the models it may answer on. Copy into your
// eve app's agent/lib/ folder with the rest of the template (docs/configuration.md, "The eve
// agent's side"; the headers' trust: docs/security.md).
//
// Iva sends, on every create, send and answer (eve's session routes):
//   x-iva-model    eve's id of the model the chat chose with /model (one of IVA_MODELS' ids)
//   x-iva-chat     the chat's address: "<chat id>", or "<chat id>/<topic id>" for a topic
//   x-iva-speaker  the Telegram user id of the person speaking (the latest one of a batch)
//   x-iva-role     "owner", "allowed" (a person Iva lets talk, in their own private chat) or
//                  "member" (someone speaking in a group or forum): a batch's weakest
//   x-iva-turn     "person", "pushed" (the owner API), "reminder" or "rebuild" (the notebook's
//                  rebuild: a throwaway session that must be offered no tools at all)
// channels/eve.ts copies them into the caller's attributes only after it checked Iva's bearer,
// as "iva.model", "iva.chat", ... and only in the shapes below: nobody else can set them.
// Read them with `iva(ctx)`, which trusts attributes only of the "iva-bearer" authenticator.
// The principal is "iva" for every person (channels/eve.ts says why), so eve's per-principal
// features see one caller: key per-person ones on the speaker instead, e.g. a memory slot's
// `scope: (ctx) => iva(ctx).speaker ?? null` (agent/memory/, eve's docs/memory).

export const IVA_AUTHENTICATOR = "iva-bearer";

const HEADERS = ["model", "chat", "speaker", "role", "turn"] as const;
type Field = (typeof HEADERS)[number];
export type IvaCaller = Partial<Record<Field, string>>;

const SHAPES: Record<Field, RegExp> = {
  model: /^[^\s,=]{1,200}$/,
  chat: /^-?\d{1,20}(\/\d{1,20})?$/,
  speaker: /^\d{1,20}$/,
  role: /^(owner|allowed|member)$/,
  turn: /^(person|pushed|reminder|rebuild)$/,
};

/** The x-iva-* headers of a request, as caller attributes; a value of another shape is dropped. */
export function ivaAttributes(request: Request): Record<string, string> {
  const out: Record<string, string> = {};
  for (const field of HEADERS) {
    const value = request.headers.get(`x-iva-${field}`)?.trim();
    if (value && SHAPES[field].test(value)) out[`iva.${field}`] = value;
  }
  return out;
}

type Principal = {
  readonly authenticator: string;
  readonly attributes: Readonly<Record<string, string | readonly string[]>>;
} | null | undefined;

/** What Iva said of the request the turn runs on: nothing unless Iva's bearer admitted it. */
export function iva(ctx: { session: { auth: { current?: Principal } } }): IvaCaller {
  const current = ctx.session.auth.current;
  if (!current || current.authenticator !== IVA_AUTHENTICATOR) return {};
  const out: IvaCaller = {};
  for (const field of HEADERS) {
    const value = current.attributes[`iva.${field}`];
    if (typeof value === "string") out[field] = value;
  }
  return out;
}

/** The notebook's rebuild: the turn that must be offered no tools (D4). */
export const isRebuild = (ctx: Parameters<typeof iva>[0]) => iva(ctx).turn === "rebuild";

export type AllowedModel = { name: string; id: string; window: number };

// Without IVA_MODELS: this model answers every chat, with EVE_CONTEXT_WINDOW as its window.
export const DEFAULT_MODEL = "anthropic/claude-sonnet-4.5"; // your model

/** IVA_MODELS where eve runs: the same value as Iva's (name=eve model id:window, comma-separated,
 * the first the default). Read when eve starts; a malformed entry is skipped with a warning. */
export function allowedModels(raw = process.env.IVA_MODELS ?? ""): AllowedModel[] {
  const out: AllowedModel[] = [];
  for (const part of raw.split(",").map((p) => p.trim()).filter(Boolean)) {
    const eq = part.indexOf("=");
    const colon = part.lastIndexOf(":");
    const window = Number(part.slice(colon + 1).replaceAll("_", ""));
    if (eq < 1 || colon < eq + 2 || !Number.isInteger(window) || window < 1000) {
      console.warn(`IVA_MODELS: skipped ${JSON.stringify(part)} (name=model:window)`);
      continue;
    }
    out.push({ name: part.slice(0, eq).trim(), id: part.slice(eq + 1, colon).trim(), window });
  }
  if (out.length === 0) {
    out.push({ name: "default", id: DEFAULT_MODEL, window: Number(process.env.EVE_CONTEXT_WINDOW ?? "200000") });
  }
  return out;
}

/** The model a request asked for, if the allow-list has it (by id, or by name); else the first.
 * Never throws: an unknown model would fail the turn. */
export function chooseModel(requested: string | undefined, allowed = allowedModels()): AllowedModel {
  const found = allowed.find((m) => m.id === requested) ?? allowed.find((m) => m.name === requested);
  if (requested && !found) console.warn(`x-iva-model ${JSON.stringify(requested)} is not in IVA_MODELS: the default answers`);
  return found ?? allowed[0];
}
