"""The commands a user runs: ``mservd`` (start, stop, models, metrics, run-handler) and
``torchserve``. Each runs in the user's shell; ``start`` becomes the daemon (``controller/``)."""
