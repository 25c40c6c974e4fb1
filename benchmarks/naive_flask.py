"""The naive baseline: one Flask process that calls the handler on each request, one at a time.

Loads the same archives with the same handlers (as a worker does), then serves
``POST /predictions/<model>`` and ``GET /ping`` under gunicorn with one sync worker (no threads,
no batching, a new connection per request). This is the "just wrap model(x) in a Flask route"
baseline the servers are compared with.

    python -m benchmarks.naive_flask --store model_store --models tiny,resnet18 --port 0
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path


def create_app(store: Path, names: list[str]):
    from flask import Flask, Response, request

    from benchmarks.workloads import LoadedModel
    from mservd.worker.payload import encode_output

    models = {name: LoadedModel(store / f"{name}.mar", batch_size=1) for name in names}
    app = Flask("naive")

    @app.get("/ping")
    def ping():
        return {"status": "Healthy"}

    @app.post("/predictions/<name>")
    def predict(name: str):
        model = models.get(name)
        if model is None:
            return Response(json.dumps({"code": 404, "message": f"no model {name}"}), 404,
                            mimetype="application/json")
        out = model.handle([request.get_data()], request.content_type or "")[0]
        body, content_type = encode_output(out)
        return Response(body, 200, content_type=content_type)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--models", default="tiny,resnet18")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)

    from gunicorn.app.base import BaseApplication

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(2048)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]

    class Naive(BaseApplication):
        def load_config(self) -> None:
            for key, value in {"bind": [f"fd://{sock.fileno()}"], "workers": 1,
                               "worker_class": "sync", "threads": 1, "timeout": 0,
                               "backlog": 2048, "loglevel": "warning",
                               "preload_app": False}.items():
                self.cfg.set(key, value)

        def load(self):  # in the worker, after the fork: torch never crosses a fork
            return create_app(args.store, [m for m in args.models.split(",") if m])

    sys.stdout.write(f"PORT {port}\n")
    sys.stdout.flush()
    Naive().run()


if __name__ == "__main__":
    main()
