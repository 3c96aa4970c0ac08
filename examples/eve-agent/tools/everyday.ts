// The tools a turn may use, offered per turn (D4): every turn Iva sends gets them, except the
// notebook's rebuild (x-iva-turn: rebuild), whose throwaway session is offered no tool at all.
// Add your own tools to the map (or gate them on iva(ctx).role: "owner", "allowed", "member");
// a file of its own under agent/tools/ is a static tool, offered to the rebuild too.
import { defineDynamic } from "eve/tools";
import { webFetch } from "eve/tools/web_fetch";
import { isRebuild } from "../lib/iva";

export default defineDynamic((ctx) => (isRebuild(ctx) ? null : { web_fetch: webFetch }));
