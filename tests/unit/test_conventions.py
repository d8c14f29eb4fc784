"""What every subcommand shares (``orchestrator/cli/conventions.py``): ``gathered``, which
hands a command its options as the one settings object they make."""

from __future__ import annotations

from dataclasses import dataclass

import click
from click.testing import CliRunner

from orchestrator.cli.conventions import gathered


@dataclass(frozen=True)
class Settings:
    database: str
    port: int = 8080
    tick: float = 0.5


@click.command()
@click.option("--db", default="orders")
@click.option("--port", type=int, default=9000)
@click.option("--verbose", is_flag=True)
@gathered(Settings, "settings", renamed={"db": "database"})
def show(*, settings: Settings, verbose: bool) -> None:
    click.echo(f"{settings!r} verbose={verbose}")


def test_a_command_gets_its_options_as_one_settings_object() -> None:
    result = CliRunner().invoke(show, ["--db", "jobs", "--port", "1", "--verbose"])
    assert result.exit_code == 0, result.output
    assert result.output == "Settings(database='jobs', port=1, tick=0.5) verbose=True\n"


def test_options_not_given_take_the_options_defaults_and_fields_no_option_names_theirs() -> None:
    result = CliRunner().invoke(show, [])
    assert result.output == "Settings(database='orders', port=9000, tick=0.5) verbose=False\n"
