"""Placeholder while the experiment subcommand is being written."""


def register(subparsers) -> None:
    return None
