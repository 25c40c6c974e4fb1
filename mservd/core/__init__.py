"""The controller's state and its decisions, with no I/O: the registry of model versions, their
queues and batchers, stateful sequences, the scheduler, lent workers, the batching advisor and
the metrics. Runs inside the daemon; imports neither ZeroMQ, asyncio, Flask nor gunicorn."""
