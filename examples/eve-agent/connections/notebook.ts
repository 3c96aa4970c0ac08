// The notebook connection (SPEC N3): Iva serves the notebook's tools as an MCP server on its
// local listener (IVA_API_LISTEN, default 127.0.0.1:8787). Copy this file into your eve app's
// agent/connections/ folder next to agent.ts. The file name is the connection name: the model
// reaches the tools as notebook__chat_note_save etc. (set IVA_NOTES_CONNECTION if you rename it).
//
// eve bakes the URL in at build time: rebuild the app when IVA_API_LISTEN changes.
// Both the header and the provided argument carry eve's session id; Iva maps it to the chat and
// answers only during that chat's owner turns (no tools for subagents or anyone else's turns).
import { defineMcpClientConnection } from "eve/connections";

export default defineMcpClientConnection({
  url: process.env.IVA_NOTEBOOK_MCP_URL ?? "http://127.0.0.1:8787/mcp",
  description: "Per-chat notebook: notes you keep for yourself in this chat (save, read, delete, pin).",
  headers: (ctx) => ({ "x-eve-session-id": ctx.session.id }),
  toolCall: {
    providedArguments: {
      eve_session_id: ({ session }) => session.id,
    },
  },
});
