"""Telegram in: the getUpdates loop and the webhook both hand updates to one handler
(:mod:`.ingest`), which commits each one (dedupe mark, queue row) before anything else; the
commands; who may talk and which address a message belongs to; what an edit does."""
