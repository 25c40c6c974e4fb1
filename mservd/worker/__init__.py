"""A backend worker's process (and the zygote it is forked from): load the handler, run the
batches or the continuous steps the controller and the frontends send, encode the answers."""
