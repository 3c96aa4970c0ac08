"""``iva run``, ``iva check`` and ``iva status`` (also ``python -m bridge …``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from aiogram import Bot
from aiogram.exceptions import (
    ClientDecodeError,
    TelegramAPIError,
    TelegramNetworkError,
    TelegramUnauthorizedError,
)

import eve_client as eve

from . import log, state_commands
from .chat import parking
from .config import ConfigError, Settings
from .log import one_line
from .people import pairing_note
from .telegram.sender import undecodable

__all__ = ["main"]

EXIT_CONFIG = 2
EXIT_UNREACHABLE = 3


async def _check(settings: Settings) -> int:
    problems: list[str] = []
    warnings: list[str] = []
    await _check_telegram(settings, problems, warnings)
    await _check_eve(settings, problems, warnings)
    secrets = settings.secrets
    for line in warnings:
        print(f"warn {one_line(line, secrets=secrets)}")
    for line in problems:
        print(f"FAIL {one_line(line, secrets=secrets)}", file=sys.stderr)
    return EXIT_UNREACHABLE if problems else 0




async def _check_telegram(settings: Settings, problems: list[str], warnings: list[str]) -> None:
    """The bot token (getMe), the pairing link while the bot has no owner, the webhook."""
    from .app import make_bot

    bot = make_bot(settings)
    try:
        me = await bot.get_me(request_timeout=10)
        print(f"ok   telegram: @{me.username} (id {me.id}) at {settings.telegram.api_url}")
        if not settings.people.owner_ids and (note := pairing_note(settings.db_path, os.environ, username=me.username)):
            print(f"note {note}")
            # V6: nobody could let the assistant go on past eve's session budget
            warnings.append("the bot has no owner yet: eve's budget prompts (the agent's limits.sessionUsage) go to "
                            "the owners alone, so until one pairs such a prompt is given up after IVA_BUSY_TIMEOUT")
    except TelegramUnauthorizedError:
        problems.append("telegram: the bot token was rejected (IVA_TELEGRAM_TOKEN)")
    except TelegramNetworkError as exc:
        problems.append(f"telegram: cannot reach {settings.telegram.api_url}: {exc.message}")
    except TelegramAPIError as exc:
        problems.append(f"telegram: getMe failed: {exc.message}")
    except ClientDecodeError as exc:
        problems.append(f"telegram: {settings.telegram.api_url} answered getMe with something that is not a Bot "
                        f"API user: {undecodable(exc)}")
    except Exception as exc:  # iva check never shows a traceback: one line per problem
        problems.append(f"telegram: getMe failed: {type(exc).__name__}: {exc}")
    else:
        problems.extend(await _webhook(settings, bot))
    finally:
        await bot.session.close()


async def _check_eve(settings: Settings, problems: list[str], warnings: list[str]) -> None:
    """eve answers (health), speaks a stream version Iva reads (V1), and its agent (/info)."""
    async with eve.EveClient(settings.eve.url, token=settings.eve.token,
                             retry=eve.RetryPolicy(attempts=2, deadline=10)) as client:
        try:
            health = await client.health()
            if health.ok:
                print(f"ok   eve: {settings.eve.url} is {health.status or 'up'}")
            else:
                problems.append(f"eve: {settings.eve.url} says it is not ready ({health.status})")
        except eve.EveError as exc:
            problems.append(f"eve: cannot reach {settings.eve.url}/eve/v1/health: {exc}")
        except Exception as exc:  # iva check never shows a traceback: one line per problem
            problems.append(f"eve: /eve/v1/health failed: {type(exc).__name__}: {exc}")
        else:
            problems.extend(await _stream_version(client, warnings))
            await _check_agent(settings, client, problems, warnings)


async def _check_agent(settings: Settings, client: eve.EveClient, problems: list[str], warnings: list[str]) -> None:
    """eve's /info: the agent's model, window and parking threshold; the notebook connection (V8)."""
    try:
        info = await client.info()
        window = settings.compaction.context_window or info.context_window_tokens
        ours = parking.threshold(window, settings.compaction.percent, settings.compaction.ceiling)
        dynamic = _dynamic_model(info.raw)
        if not dynamic or not settings.models:
            print(f"ok   eve agent: model {info.model_id or '(chosen per turn)'}, "
                  f"window {info.context_window_tokens or '(not reported)'}, parking threshold {ours}")
        warnings.extend(_models(settings, dynamic, info.model_id))
        if settings.compaction.context_window and info.context_window_tokens and \
                settings.compaction.context_window != info.context_window_tokens:
            warnings.append(f"IVA_CONTEXT_WINDOW={settings.compaction.context_window} but eve reports "
                            f"{info.context_window_tokens}")
        if window:
            safety = parking.in_turn_threshold(window, settings.compaction.inturn_percent)
            if ours >= safety:
                warnings.append(
                    f"the parking threshold {ours} is not below eve's in-turn safety net {safety} "
                    f"(min(75% of {window}, 137 500)); eve would compact inside turns first. "
                    "Lower IVA_COMPACT_PERCENT/IVA_COMPACT_CEILING (see examples/eve-agent/agent.ts)"
                )
        if settings.notes.enabled and dynamic:
            print("note notebook: eve's agent chooses its definitions per turn (examples/eve-agent): /info "
                  "lists its notebook connection only once a turn used it, so it is not checked here")
        elif settings.notes.enabled:
            warnings.extend(_notebook_connection(settings, info.raw))
    except eve.EveUnauthorized:
        problems.append("eve: the token was rejected (IVA_EVE_TOKEN)")
    except eve.EveRejected as exc:
        if exc.status != 403:
            problems.append(f"eve: /eve/v1/info failed: {exc}")
        elif settings.compaction.context_window:  # V8
            warnings.append(f"eve: this token cannot read /eve/v1/info ({exc.code or 403}: eve 1.x serves it "
                            "to service callers only); the window is "
                            f"IVA_CONTEXT_WINDOW={settings.compaction.context_window}")
        else:
            problems.append(f"eve: this token cannot read /eve/v1/info ({exc.code or 403}: eve 1.x serves it "
                            "to service callers only), so the context window is unknown: set "
                            "IVA_CONTEXT_WINDOW, or make Iva's caller a service principal in the agent's eve "
                            "channel (examples/eve-agent/channels/eve.ts)")
    except eve.EveError as exc:
        problems.append(f"eve: /eve/v1/info failed: {exc}")
    except Exception as exc:  # iva check never shows a traceback: one line per problem
        problems.append(f"eve: /eve/v1/info answered something unexpected: {type(exc).__name__}: {exc}")


async def _stream_version(client: eve.EveClient, warnings: list[str]) -> list[str]:
    """V1, V8: eve's own version and the stream version it speaks (from a stream's header: a
    message-free session read once and ended); one this Iva cannot read fails clearly."""
    try:
        version = await client.probe_stream_version()
    except eve.UnsupportedStream as exc:
        return [f"eve: {exc}"]
    except eve.EveError as exc:
        warnings.append(f"eve: could not read a stream to learn its version: {exc}")
        return []
    try:
        named = (await client.info()).eve_version
    except eve.EveError:
        named = None
    wire = "eve 0.80.x, kept for one deprecation window: upgrade eve to 1.x" if version == 26 else "eve 1.x"
    print(f"ok   eve: version {named or '(not reported)'}, stream version {version} ({wire})")
    if version == 26:
        warnings.append("eve 0.80.x speaks stream version 26, which Iva reads for one more deprecation window; "
                        "see docs/operating.md, \"Upgrading eve\"")
    return []


async def _webhook(settings: Settings, bot: Bot) -> list[str]:
    """O1: webhook mode needs an https URL and Telegram reporting no delivery error for it;
    polling mode is told about a webhook still set (Iva deletes it at start, keeping its updates)."""
    problems: list[str] = []
    url = settings.webhook.url
    if url is not None and not url.lower().startswith("https://"):
        problems.append(f"webhook: IVA_TELEGRAM_WEBHOOK_URL={url} is not https: Telegram only calls https URLs "
                        "(end TLS at a reverse proxy in front of IVA_WEBHOOK_LISTEN)")
    try:
        info = await bot.get_webhook_info(request_timeout=10)
    except Exception as exc:  # one line, never a traceback, whatever the server answers
        if url is None:  # polling: only a note (Iva deletes a webhook still set at start)
            print("note " + one_line(f"webhook: not known, getWebhookInfo failed: {type(exc).__name__}: {exc}"))
        else:
            problems.append(one_line(f"webhook: getWebhookInfo failed: {type(exc).__name__}: {exc}"))
        return problems
    if url is None:
        if info.url:
            print(f"note webhook: Telegram has a webhook set ({info.url}, {info.pending_update_count} updates "
                  "pending); Iva polls, so it deletes it at start and gets those updates by polling")
        else:
            print("ok   telegram: polling (no webhook set)")
        return problems
    if not info.url:
        print(f"note webhook: not set yet; Iva sets it to {url} at start")
    elif info.url != url:
        print(f"note webhook: Telegram has {info.url} set; Iva sets it to {url} at start")
    elif info.last_error_message:
        when = f" at {info.last_error_date:%Y-%m-%d %H:%M:%S %Z}" if info.last_error_date is not None else ""
        problems.append(f"webhook: Telegram's last delivery to {url} failed{when}: {info.last_error_message} "
                        f"({info.pending_update_count} updates pending)")
    else:
        print(f"ok   webhook: Telegram delivers to {url} ({info.pending_update_count} updates pending)")
    return problems


def _dynamic_model(raw: object) -> bool:
    """eve 1.x's /info of an agent whose model is a ``defineDynamic`` (D1): no id, no window."""
    agent = raw.get("agent") if isinstance(raw, dict) else None
    model = agent.get("model") if isinstance(agent, dict) else None
    routing = model.get("routing") if isinstance(model, dict) else None
    return isinstance(routing, dict) and routing.get("kind") == "dynamic"


def _models(settings: Settings, dynamic: bool, model_id: str | None) -> list[str]:
    """D1, D3: each allowed model's window and parking threshold, and the agent's side of it."""
    warnings: list[str] = []
    for model in settings.models.entries:
        ours = parking.threshold(model.window, settings.compaction.percent, settings.compaction.ceiling)
        print(f"ok   model {model.name}: {model.id}, window {model.window}, parking threshold {ours}"
              + (" (the default)" if model is settings.models.default else "")
              + (" (the notebook's, IVA_NOTES_MODEL)" if model is settings.models.notes else ""))
        safety = parking.in_turn_threshold(model.window, settings.compaction.inturn_percent)
        if ours >= safety:
            warnings.append(f"model {model.name}: the parking threshold {ours} is not below eve's in-turn safety "
                            f"net {safety}; lower IVA_COMPACT_PERCENT/IVA_COMPACT_CEILING")
    if settings.models and not dynamic:
        warnings.append(f"IVA_MODELS is set, but eve's agent answers on one fixed model ({model_id or '?'}): /model "
                        "choices do not reach it; build it from examples/eve-agent (model: defineDynamic)")
    elif dynamic and not settings.models and not settings.compaction.context_window:
        warnings.append("eve's agent chooses its model per turn and names no window: set IVA_MODELS (the same value "
                        "where eve runs), or IVA_CONTEXT_WINDOW")
    return warnings


def _notebook_connection(settings: Settings, raw: object) -> list[str]:
    """N3: the agent needs an MCP connection to Iva's /mcp, or the model cannot write notes."""
    agent = raw.get("agent") if isinstance(raw, dict) else None
    found = (raw.get("connections") if isinstance(raw, dict) else None) or \
        (agent.get("connections") if isinstance(agent, dict) else None) or []
    name = settings.notes.connection
    mine = next((c for c in found if isinstance(c, dict) and c.get("connectionName") == name), None)
    expected = f"http://{settings.api.listen}/mcp"
    if mine is None:
        return [f"notebook: eve's agent has no connection named {name!r}, so the model cannot write notes; "
                "add examples/eve-agent/connections/notebook.ts to it (or set IVA_NOTES_ENABLED=0)"]
    url = str(mine.get("url") or "")
    if url.rstrip("/") != expected and not url.endswith(f":{settings.api.listen.rpartition(':')[2]}/mcp"):
        return [f"notebook: eve's {name!r} connection points at {url}, but Iva serves it at {expected}"]
    print(f"ok   notebook: eve's {name!r} connection points at {url}")
    # S1. eve's /info reports no connection's headers (hasHeaders is false even when a headers
    # resolver is set, PROTOCOL.md §11), so whether eve sends the token cannot be seen from here.
    print(f"note notebook: eve's /info does not show the {name!r} connection's headers, so whether eve sends "
          "the /mcp token is not checked here; a missing or wrong one shows as mcp_unauthorized in Iva's log")
    if not settings.api.mcp_token:
        return [f"notebook: IVA_MCP_TOKEN is not set, so /mcp on {settings.api.listen} takes calls from any "
                "local process; set it, and the same value as NOTEBOOK_MCP_TOKEN where eve builds "
                "(examples/eve-agent/connections/notebook.ts sends it)"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="iva", description="Iva: a Telegram bridge for eve agents")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the bridge (configured by IVA_* environment variables)")
    sub.add_parser("check", help="validate the configuration and reach Telegram and eve")
    status = sub.add_parser("status", help="what the state database says: busy chats, queues, pending replies, "
                            "errors (read-only; works while the bridge runs)")
    status.add_argument("--state", metavar="DIR", help="the state directory (default: IVA_STATE_DIR, "
                        "$STATE_DIRECTORY, ./var)")
    status.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    status.add_argument("--dead", action="store_true", help="list the messages given up on (eve kept failing "
                        "on them: IVA_EVE_SEND_ATTEMPTS or IVA_EVE_SEND_MAX_AGE)")
    status.add_argument("--clear-dead", action="store_true", help="forget the messages given up on, and their "
                        "warning (the one write beside a running daemon, with a pairing link's)")
    sessions = sub.add_parser("sessions", help="the chats whose eve session an eve upgrade stranded (another "
                              "eve built it); --renew-stranded moves them to new sessions now")
    sessions.add_argument("--state", metavar="DIR", help="the state directory (default: IVA_STATE_DIR, "
                          "$STATE_DIRECTORY, ./var)")
    sessions.add_argument("--renew-stranded", action="store_true", help="every idle chat on a stranded session "
                          "starts a new one at its next message (the person told once); safe beside a running "
                          "bridge")
    sessions.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    restore = sub.add_parser("restore-notes", help="bring the notebooks back from a moved-aside (quarantined) "
                             "state database: every note that reads cleanly, never over a newer one")
    restore.add_argument("file", metavar="FILE", help="the quarantined file (iva.sqlite3.quarantined-…)")
    restore.add_argument("--state", metavar="DIR", help="the state directory (default: IVA_STATE_DIR, "
                         "$STATE_DIRECTORY, ./var)")
    args = parser.parse_args(argv)
    if args.command == "status":  # needs no configuration: only the database
        return state_commands.status(args)
    if args.command == "restore-notes":
        return state_commands.restore_notes(args)
    if args.command == "sessions":
        return state_commands.sessions(args)

    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        print("iva: the configuration has problems:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return EXIT_CONFIG

    # S5: no secret in any log line, whatever a library puts in an error text.
    secrets = settings.secrets
    if args.command == "check":
        log.configure("warning", secrets=secrets)
        try:
            return asyncio.run(_check(settings))
        except KeyboardInterrupt:
            print("iva check: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:  # the last guard: still one line, never a traceback
            print(f"FAIL iva check: {one_line(f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
            return EXIT_UNREACHABLE
    log.configure(settings.log_level, secrets=secrets)
    from .app import run

    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
