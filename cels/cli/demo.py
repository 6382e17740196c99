"""Placeholder while the demo subcommand is being written."""


def register(subparsers) -> None:
    return None
