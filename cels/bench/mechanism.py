"""Placeholder while the mechanism benchmark is being written."""


def register(subparsers) -> None:
    return None
