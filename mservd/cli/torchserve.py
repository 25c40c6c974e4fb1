"""The ``torchserve`` command: TorchServe's start/stop flags, served by mservd.

Scripts, Dockerfiles and docs that run ``torchserve --start --model-store store --models m.mar
--ts-config config.properties`` keep working: the flags map onto ``mservd start`` and
``mservd stop`` (run as ``python -m mservd ...``, so the detached daemon is the same program
``mservd start`` starts). Logs, the pid and the state file go to ``logs/`` under the current
folder, as TorchServe's do. Flags that configure parts mservd does not have (the Java log
config, plugins, workflows, the C++ backend) are accepted and ignored with a note.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from mservd import __version__

IGNORED = {
    "log_config": "--log-config (a log4j2 file for TorchServe's Java frontend)",
    "cpp_log_config": "--cpp-log-config (TorchServe's C++ backend)",
    "plugins_path": "--plugins-path (TorchServe's Java plugins)",
    "workflow_store": "--workflow-store (TorchServe workflows)",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchserve",
        description="TorchServe-compatible entry of mservd: start or stop the model server.")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--start", action="store_true", help="Start the model server.")
    action.add_argument("--stop", action="store_true", help="Stop the model server.")
    p.add_argument("--ts-config", dest="ts_config",
                   help="Configuration file for the model server (config.properties).")
    p.add_argument("--model-store", dest="model_store",
                   help="Model store location from where local or default models can be loaded.")
    p.add_argument("--models", metavar="MODEL_PATH1 MODEL_NAME=MODEL_PATH2...", nargs="+",
                   help="Models to be loaded using [model_name=]model_location format; "
                        "'all' loads every archive in the model store.")
    p.add_argument("--ncs", "--no-config-snapshots", dest="no_config_snapshots",
                   action="store_true", help="Prevents the server from storing config snapshots.")
    p.add_argument("--foreground", action="store_true",
                   help="Run the model server in foreground; Ctrl-C stops it.")
    p.add_argument("--disable-token-auth", "--disable-token", dest="disable_token_auth",
                   action="store_true", help="Disable token authorization.")
    p.add_argument("--enable-model-api", dest="enable_model_api", action="store_true",
                   help="Enable model registration and unregistration through the API.")
    p.add_argument("--log-config", dest="log_config", help="Ignored by mservd.")
    p.add_argument("--cpp-log-config", dest="cpp_log_config", help="Ignored by mservd.")
    p.add_argument("--plugins-path", "--ppath", dest="plugins_path", help="Ignored by mservd.")
    p.add_argument("--workflow-store", dest="workflow_store", help="Ignored by mservd.")
    p.add_argument("-v", "--version", action="store_true", help="Return the version.")
    return p


def mservd_argv(args: argparse.Namespace) -> list[str]:
    """The ``mservd start`` arguments for parsed ``torchserve --start`` flags."""
    argv = ["start"]
    if args.model_store:
        argv += ["--model-store", args.model_store]
    for model in args.models or ():
        argv += ["--models", model]
    if args.ts_config:
        argv += ["--ts-config", args.ts_config]
    if args.no_config_snapshots:
        argv.append("--ncs")
    if args.foreground:
        argv.append("--foreground")
    if args.disable_token_auth:
        argv.append("--disable-token-auth")
    if args.enable_model_api:
        argv.append("--enable-model-api")
    return argv


def _run(argv: list[str]) -> int:
    return subprocess.call([sys.executable, "-m", "mservd", *argv])


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.version:
        print(f"TorchServe Version is {__version__} (mservd)")
        return 0
    for name, what in IGNORED.items():
        if getattr(args, name, None):
            print(f"note: mservd ignores {what}.", file=sys.stderr)
    if args.stop:
        from mservd.controller.daemon import running_pid

        if running_pid(Path("logs").resolve()) is None:
            print("TorchServe is not currently running.")
            return 0
        return _run(["stop", "--log-dir", "logs"])
    if not args.start:
        # TorchServe starts when neither flag is given
        args.start = True
    if (not args.model_store and not args.ts_config and not os.environ.get("TS_CONFIG_FILE")
            and os.path.isfile("config.properties")):
        args.ts_config = "config.properties"  # TorchServe reads it from the current folder
    return _run(mservd_argv(args))


if __name__ == "__main__":
    sys.exit(main())
