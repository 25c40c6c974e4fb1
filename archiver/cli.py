"""The ``model-archiver`` command: TorchServe's ``torch-model-archiver`` flags over our writer.

Owns argument parsing and the error line only; everything else is :func:`archiver.writer.write_archive`.
Only :func:`main` exits: an :class:`~archiver.errors.ArchiveError` becomes
``model-archiver: error: <message>`` on stderr and exit status 1, like TorchServe's tool.
"""

from __future__ import annotations

from typing import IO, Any

import click

from archiver.errors import ArchiveError
from archiver.writer import ARCHIVE_FORMATS, write_archive

__all__ = ["main"]


class _ArchiveFailed(click.ClickException):
    """An ArchiveError on its way to the terminal, worded like argparse's ``prog: error:``."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"model-archiver: error: {self.format_message()}", file=file, err=True)


@click.command(name="model-archiver", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--model-name", required=True, help="Model name; the archive is <name>.mar.")
@click.option(
    "-v",
    "--version",
    "version",
    default="1.0",
    show_default=True,
    help="Model version recorded in the manifest.",
)
@click.option(
    "--handler", required=True, help="Built-in handler name, or handler file as file.py[:function]."
)
@click.option("--serialized-file", help="Weights: a TorchScript file or a state dict.")
@click.option("--model-file", help="Python file defining the model class (eager models).")
@click.option("--extra-files", default="", help="Comma-separated files and directories to add.")
@click.option("-r", "--requirements-file", help="Python requirements for this model.")
@click.option("-c", "--config-file", help="model-config.yaml for this model.")
@click.option(
    "--export-path",
    default=".",
    show_default=True,
    help="Existing directory to write the archive into.",
)
@click.option(
    "--archive-format",
    type=click.Choice(list(ARCHIVE_FORMATS)),
    default="default",
    show_default=True,
    help="zip deflated, zip stored, tar.gz, or a plain directory.",
)
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing archive.")
@click.option(
    "--runtime",
    type=click.Choice(["python"]),
    default="python",
    show_default=True,
    help="Handler runtime; only python is supported.",
)
def main(
    model_name: str,
    version: str,
    handler: str,
    serialized_file: str | None,
    model_file: str | None,
    extra_files: str,
    requirements_file: str | None,
    config_file: str | None,
    export_path: str,
    archive_format: str,
    force: bool,
    runtime: str,
) -> None:
    """Package model artifacts into a TorchServe-compatible model archive (.mar)."""
    try:
        write_archive(
            model_name=model_name,
            version=version,
            handler=handler,
            serialized_file=serialized_file,
            model_file=model_file,
            extra_files=extra_files,
            requirements_file=requirements_file,
            config_file=config_file,
            export_path=export_path,
            archive_format=archive_format,
            force=force,
        )
    except ArchiveError as exc:
        raise _ArchiveFailed(str(exc)) from None
