"""Placeholder while the protocol benchmark is being written."""


def register(subparsers) -> None:
    return None
