"""Placeholder while the crypto benchmark is being written."""


def register(subparsers) -> None:
    return None
