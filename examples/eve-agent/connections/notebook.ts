// The notebook connection (SPEC N3): Iva serves the notebook's tools as an MCP server on its
// local listener (IVA_API_LISTEN, default 127.0.0.1:8787). Copy this file into your eve app's
// agent/connections/ folder next to agent.ts. The file name is the connection name: the model
// reaches the tools as notebook__chat_note_save etc. (set IVA_NOTES_CONNECTION if you rename it).
//
// The connection is dynamic (below), so eve reads IVA_NOTEBOOK_MCP_URL and NOTEBOOK_MCP_TOKEN
// where it runs, when it starts (a static connection had them baked in at build): restart eve
// when IVA_API_LISTEN or the token changes. NOTEBOOK_MCP_TOKEN must equal Iva's IVA_MCP_TOKEN
// (S1): every MCP request then carries "authorization: Bearer <token>", and Iva answers 401 to a
// request without it. Iva refuses to start off loopback without IVA_MCP_TOKEN; on loopback it
// works without one and warns.
//
// Both the header and the provided argument carry eve's session id; Iva maps it to the chat and
// answers only during that chat's owner turns (no tools for subagents or anyone else's turns).
// eve adds the provided argument to every call and hides it from the model; the tools' schemas
// do not mention it.
//
// D4: the notebook's rebuild (x-iva-turn: rebuild, lib/iva.ts) gets no connection at all, so
// neither eve__search nor eve__tool is offered to it: its throwaway session has no tools.
import { defineDynamic, defineMcpClientConnection } from "eve/connections";
import { isRebuild } from "../lib/iva";

const token = process.env.NOTEBOOK_MCP_TOKEN ?? "";

const notebook = defineMcpClientConnection({
  url: process.env.IVA_NOTEBOOK_MCP_URL ?? "http://127.0.0.1:8787/mcp",
  description: "Per-chat notebook: notes you keep for yourself in this chat (save, read, delete, pin).",
  headers: (ctx) => ({
    "x-eve-session-id": ctx.session.id,
    ...(token ? { authorization: `Bearer ${token}` } : {}),
  }),
  toolCall: {
    providedArguments: {
      eve_session_id: ({ session }) => session.id,
    },
  },
});

export default defineDynamic((ctx) => (isRebuild(ctx) ? null : notebook));
