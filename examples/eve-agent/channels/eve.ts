// eve's HTTP channel as Iva calls it. Copy into your eve app's agent/channels/ folder.
//
// Iva sends "authorization: Bearer <IVA_EVE_TOKEN>" on every request. Set the same value where
// eve runs, in the environment variable IVA_EVE_TOKEN (read at run time, on every request: a new
// token needs a restart of eve, not a rebuild). Without it this entry admits nobody.
//
// Iva's caller is a "service" principal: eve 1.x serves GET /eve/v1/info (the model's context
// window, which Iva parks each conversation against) only to operator callers ("service",
// "runtime", or what localDev() admits on `eve dev`) and answers anyone else 403 info_forbidden.
// With another principal type Iva says so, and the window must then come from IVA_CONTEXT_WINDOW.
// localDev() admits requests only on `eve dev`, never on a built server.
//
// Per request (D2), once the bearer is Iva's, the x-iva-* headers (the chat's model, the chat,
// the speaker, their role, the turn's kind; lib/iva.ts) become the caller's attributes
// ("iva.model", ...), which the dynamic model, tools and connection read through lib/iva.ts's
// iva(ctx). A request without Iva's bearer never gets that far: its headers are never read.
// The principal stays "iva" whoever speaks: eve lets only the running turn's own caller join it,
// so a person per principal would stop Iva's steering of a busy group chat; per-person features
// key on the "iva.speaker" attribute instead (docs/security.md).
import { createHash, timingSafeEqual } from "node:crypto";
import { localDev, withAuthChallenges, type AuthFn } from "eve/channels/auth";
import { defaultEveAuth, eveChannel, type EveMessageContext } from "eve/channels/eve";
import { IVA_AUTHENTICATOR, ivaAttributes } from "../lib/iva";

const digest = (value: string) => createHash("sha256").update(value).digest();

const iva: AuthFn<Request> = withAuthChallenges(
  (request) => {
    const token = process.env.IVA_EVE_TOKEN ?? "";
    const header = request.headers.get("authorization") ?? "";
    if (!token || !timingSafeEqual(digest(header), digest(`Bearer ${token}`))) return null;
    return {
      attributes: ivaAttributes(request),
      authenticator: IVA_AUTHENTICATOR,
      principalId: "iva",
      principalType: "service",
    };
  },
  [{ scheme: "Bearer" }],
);

type Entry = { role: "user" | "assistant"; text: string };
const MAX_ENTRIES = 40;
const MAX_TEXT = 20_000;

// V5: after an eve upgrade stranded a chat's session, Iva sends the new session's first message
// with the recent exchange it read from the old one: clientContext {"ivaHistory": [...],
// "context": "..."}. eve takes prior history only from channel code, never from a request body:
// here, once the caller is Iva (its bearer checked above), the entries become that message's
// `history` (real user and assistant turns for the model) and the usual context goes on as the
// turn's. Anyone else's clientContext is left as it came.
function carried(ctx: EveMessageContext): { history: Entry[]; context: string[] } | null {
  const caller = ctx.eve.caller;
  const sent = ctx.eve.clientContext as unknown;
  if (caller?.authenticator !== IVA_AUTHENTICATOR || !sent || typeof sent !== "object" || Array.isArray(sent)) {
    return null;
  }
  const { ivaHistory, context } = sent as { ivaHistory?: unknown; context?: unknown };
  if (!Array.isArray(ivaHistory)) return null;
  const history = ivaHistory
    .filter((e): e is Entry => !!e && (e.role === "user" || e.role === "assistant")
      && typeof e.text === "string" && e.text.trim() !== "")
    .slice(-MAX_ENTRIES)
    .map(({ role, text }) => ({ role, text: text.slice(0, MAX_TEXT) }));
  return { history, context: typeof context === "string" && context ? [context] : [] };
}

export default eveChannel({
  auth: [iva, localDev()],
  onMessage(ctx) {
    const auth = defaultEveAuth(ctx);
    const prior = carried(ctx);
    if (!prior) return { auth };
    return { auth, history: prior.history, clientContext: prior.context };
  },
});
