"""The HTTP frontends: gunicorn's arbiter and ASGI workers (``arbiter.py``) serving one ASGI
app (``app.py``) on the inference (hot path), management (Flask) and metrics ports."""
