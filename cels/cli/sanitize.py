"""Placeholder while the sanitize subcommand is being written."""


def register(subparsers) -> None:
    return None
