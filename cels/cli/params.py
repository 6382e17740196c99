"""Placeholder while the params subcommand is being written."""


def register(subparsers) -> None:
    return None
