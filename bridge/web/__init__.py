"""HTTP, both ways in: the local listener (``/healthz``, ``/metrics``), the guards every route
applies first, and the HTTP adapters of the domain — the owner API (notes, pushes, reminders) and
the notebook's MCP server. The domain packages (``notebook/``, ``push/``) never import this one."""
