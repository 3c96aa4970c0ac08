"""The assistant writes first (W1-W10): turns pushed through the owner API, notifications sent
without the model, and reminders that fall due as pushed turns.

:mod:`.turns` has no import of the chat machinery at run time, so the machinery (the claim, the
steer, the send) may call into it; :mod:`.reminders`, :mod:`.api`, :mod:`.tools` and
:mod:`.chat` build on it.
"""
