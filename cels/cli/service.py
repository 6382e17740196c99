"""Placeholder while the service subcommand is being written."""


def register(subparsers) -> None:
    return None
