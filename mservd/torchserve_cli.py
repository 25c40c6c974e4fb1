"""The old path of :mod:`mservd.cli.torchserve`, kept because TorchServe users' scripts run
``python -m mservd.torchserve_cli``."""

from mservd.cli.torchserve import main

if __name__ == "__main__":
    raise SystemExit(main())
