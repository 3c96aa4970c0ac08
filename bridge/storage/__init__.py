"""The state on disk: the numbered schema (:mod:`.schema`), one small class per table returning
frozen rows (:mod:`.chats`, :mod:`.outbox`, :mod:`.prompts`, :mod:`.people`, :mod:`.spend`,
:mod:`.status`; :mod:`.store` composes them, and the pushes' own, :mod:`.pushes`), the typed
dedupe marks (:mod:`.marks`), opening it checked (:mod:`.state`), the typed queue payloads
(:mod:`.payloads`), the address of a chat as a value (:mod:`.address`) and retention."""
