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
import { eveChannel } from "eve/channels/eve";
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

export default eveChannel({
  auth: [iva, localDev()],
});
