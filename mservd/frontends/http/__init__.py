"""The HTTP frontends: inference, management and metrics apps under one gunicorn."""
