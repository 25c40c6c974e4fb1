"""``mservd workflows register/list/describe/unregister``: TorchServe's workflow management
API from the command line, in the style of ``mservd models``."""

from __future__ import annotations

import click

from mservd.cli.client import (
    Client,
    _print_json,
    _print_status,
    _table,
    all_pages,
    client_options,
    json_option,
)


@click.group("workflows")
def workflows_group() -> None:
    """Register, list, describe and unregister workflows (.war) of a running daemon."""


@workflows_group.command("register")
@click.argument("url")
@click.option("--workflow-name", help="Register under this name instead of the archive's.")
@click.option("--response-timeout", type=click.IntRange(min=1),
              help="Seconds one /wfpredict may take.")
@click.option("--startup-timeout", type=click.IntRange(min=1),
              help="Seconds a node's worker may take to load.")
@client_options()
@json_option
def register_command(client: Client, url: str, workflow_name: str | None,
                     response_timeout: int | None, startup_timeout: int | None,
                     as_json: bool) -> None:
    """Register the workflow archive URL (a .war in the workflow store, or an allowed URL);
    returns once every node's workers are ready."""
    _print_status(client.call("POST", "/workflows", {
        "url": url, "workflow_name": workflow_name, "response_timeout": response_timeout,
        "startup_timeout": startup_timeout}), as_json)


@workflows_group.command("list")
@client_options()
@json_option
def list_command(client: Client, as_json: bool) -> None:
    """List the registered workflows: name and archive."""
    workflows = all_pages(client, "/workflows", "workflows")
    if as_json:
        _print_json({"workflows": workflows})
    elif not workflows:
        click.echo("No workflows are registered.")
    else:
        click.echo(_table(("NAME", "URL"), [(w["workflowName"], w.get("workflowUrl", ""))
                                            for w in workflows]))


@workflows_group.command("describe")
@click.argument("name")
@client_options()
@json_option
def describe_command(client: Client, name: str, as_json: bool) -> None:
    """Describe workflow NAME: its archive, defaults and graph (its nodes are models:
    ``mservd models describe NAME__NODE``)."""
    (desc,) = client.call("GET", f"/workflows/{name}")
    if as_json:
        _print_json([desc])
        return
    click.echo("\n".join([
        desc["workflowName"],
        f"  url:     {desc.get('workflowUrl', '')}",
        f"  workers: min {desc.get('minWorkers')}, max {desc.get('maxWorkers')}",
        f"  batch:   {desc.get('batchSize')}, delay {desc.get('maxBatchDelay')} ms",
        f"  dag:     {desc.get('workflowDag')}"]))


@workflows_group.command("unregister")
@click.argument("name")
@client_options()
@json_option
def unregister_command(client: Client, name: str, as_json: bool) -> None:
    """Unregister workflow NAME and its node models."""
    _print_status(client.call("DELETE", f"/workflows/{name}"), as_json)
