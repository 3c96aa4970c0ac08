"""The state on disk: the numbered schema and the bridge's SQL (:mod:`.store`, and the pushes'
own, :mod:`.pushes`), opening it checked (:mod:`.state`), the typed queue payloads
(:mod:`.payloads`), the address of a chat as a value (:mod:`.address`) and retention."""
