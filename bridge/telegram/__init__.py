"""Telegram out: every Bot API call that posts or edits goes through :mod:`.sender` and the one
pacer (:mod:`.pacing`); Markdown rendering and splitting (:mod:`.render`); every text, ru/en
(:mod:`.texts`)."""
