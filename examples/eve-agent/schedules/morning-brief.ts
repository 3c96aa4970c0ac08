// A schedule behind Iva (SPEC W10): eve fires it on its cadence, and instead of answering into a
// channel of its own it pushes a turn into the person's Telegram chat through Iva's owner API.
// The turn runs in that chat's conversation (its eve session, its notebook), waits for whatever
// the chat is doing, and the answer reaches the person like any other; eve is told the turn was
// pushed, by whom and with which key.
//
// Copy into your eve app's agent/schedules/ folder and set, where eve runs (read at run time):
//   IVA_PUSH_URL    http://127.0.0.1:8787/v1/chats/<chat id>/turns   (<chat id>:<topic id> for a topic)
//   IVA_PUSH_TOKEN  Iva's IVA_API_TOKEN (not IVA_MCP_TOKEN: that one opens only the notebook's tools)
//
// The key names the fire (the schedule's name and the minute it is for): a retried run, or eve
// running the same fire twice, pushes the same key, and Iva answers it once (202 with the same
// id). A failed POST (Iva restarting) is retried here a few times with that same key.
import { defineSchedule } from "eve/schedules";

const NAME = "morning-brief";

export default defineSchedule({
  cron: "30 7 * * 1-5", // 07:30 on weekdays, in eve's time zone
  async run({ waitUntil }) {
    const url = process.env.IVA_PUSH_URL ?? "";
    if (!url) return;
    const minute = new Date().toISOString().slice(0, 16); // the fire, to the minute (UTC)
    const body = JSON.stringify({
      text: "Morning brief: what is on my calendar today, and what did I leave open yesterday?",
      key: `eve-schedule:${NAME}:${minute}`,
      by: `eve schedule ${NAME}`,
    });
    waitUntil(
      (async () => {
        for (let attempt = 1; attempt <= 5; attempt++) {
          try {
            const response = await fetch(url, {
              method: "POST",
              headers: {
                "content-type": "application/json",
                authorization: `Bearer ${process.env.IVA_PUSH_TOKEN ?? ""}`,
              },
              body,
            });
            // 202: queued (or the same key seen before). 4xx: our request is wrong; retrying
            // will not help (the JSON error names the field; 404: Iva does not know the chat yet).
            if (response.status < 500) return;
          } catch {
            // Iva is restarting or unreachable: try again with the same key.
          }
          await new Promise((resolve) => setTimeout(resolve, attempt * 2000));
        }
      })(),
    );
  },
});
