"""The HTTP frontends: one asyncio server process type serving the inference (hot path),
management (Flask) and metrics ports."""
