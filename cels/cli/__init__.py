"""The ``cels`` command line: one subcommand module per capability.

Each module in :data:`COMMANDS` exposes ``register(subparsers)``, which adds its parser and
sets ``func``: a callable taking the parsed namespace and returning an exit code, or the name
``"module:function"`` of one, imported only when the command runs.  Only the module of the
command given is imported: ``cels --help`` lists the commands from :data:`COMMANDS` without
importing any of them, and ``cels simulate --help`` loads no gRPC or numpy.

Exit codes (README, "Exit codes"): 0 done; 1 a distributed session aborted; 2 bad input,
parameters or configuration (one line naming the file, table or flag); 3 the release is
empty (its output and report are written, with the reason on stderr); 4 ``cels status``: the
node serves but a peer cannot be reached (1 there: the node is not serving); 130 interrupted;
143 / 129 stopped by SIGTERM / SIGHUP (temporary outputs removed, started nodes stopped).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from cels import __version__
from cels.fileio import Terminated, raise_on_termination
from cels.lazy import resolve

DESCRIPTION = (
    "Publish what the private logs of one or several organisations hold, in one of two releases (--release; "
    "docs/releases.md): a DP histogram of query-url pairs with noisy counts, (epsilon, delta)-DP end to end; or "
    "one sanitized search log, whose sampling is (epsilon, delta)-probabilistically differentially private given "
    "the released counts, which are computed from the data (with --noise-epsilon, noisy but repaired from the "
    "data), so no end-to-end bound is claimed for it. Partner organisations learn what SECURITY.md's table says."
)
COMMANDS: dict[str, tuple[str, str]] = {
    "sanitize": ("cels.cli.sanitize", "sanitize one search log (a single data holder)"),
    "simulate": ("cels.cli.distributed", "run a whole distributed session with local node processes on 127.0.0.1"),
    "run": ("cels.cli.distributed", "run a session against running party and solver nodes (session.toml)"),
    "certs": ("cels.cli.distributed", "make a development CA and one certificate per node"),
    "ray-tls": ("cels.cli.distributed", "issue a certificate of a party's own Ray CA: a Ray host's (its addresses) or the party node's"),
    "split": ("cels.cli.split", "split one log by user into per-party files"),
    "ledger": ("cels.cli.ledger", "show a party node's privacy budget ledger and the budget left"),
    "status": ("cels.cli.status", "is a node serving: its sessions, ledger and peers (node.toml)"),
    "approve": ("cels.cli.approve", "approve a session that waits for a party node's operator (its policy: approve = manual)"),
    "reject": ("cels.cli.approve", "reject a session that waits for a party node's operator"),
    "demo": ("cels.cli.demo", "sanitize the embedded synthetic log and print a summary"),
    "params": ("cels.cli.params", "baseline parameter calculations as JSON"),
    "bench": ("cels.cli.bench", "measure speed, bytes and memory; prints JSON"),
    "experiment": ("cels.cli.experiment", "reproduce the paper's experiments (CSV/JSON + PNG)"),
    "views": ("cels.cli.views", "summarise recorded node views and draw the sequence diagram"),
    "attack": ("cels.cli.attack", "demonstrate the paper's protocol weaknesses (SECURITY.md)"),
}
"""Command -> (module that registers it, one-line help)."""
EXIT_CODES = {0: "done", 1: "a distributed session aborted", 2: "bad input, parameters or configuration",
              3: "empty release (output and report written)", 4: "status: the node serves but a peer cannot be reached",
              130: "interrupted (Ctrl-C)"}  # fmt: skip


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``cels`` parser; only ``command``'s module is imported and registers its flags."""
    parser = argparse.ArgumentParser(
        prog="cels",
        description=DESCRIPTION,
        epilog="exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()),
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action="version", version=f"cels {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if command is not None:
        importlib.import_module(COMMANDS[command][0]).register(subparsers)
    for name, (_module, help) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help)  # listed by --help; its module is not imported
        else:
            subparsers.choices[name].description = subparsers.choices[name].description or f"cels {name}: {help}."
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The first argument that names a command (after options such as -v)."""
    return next((arg for arg in argv if arg in COMMANDS), None)


def command_function(func: Callable[[argparse.Namespace], int] | str) -> Callable[[argparse.Namespace], int]:
    """A parser's ``func``: the callable, or the one its ``"module:function"`` name gives."""
    return resolve(func) if isinstance(func, str) else func


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's C core logs no raw handshake lines on the console: each failure is one line of ours
    parser = build_parser(command_of(argv))
    if not argv:  # no command: the command list, not only a usage error
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    raise_on_termination()
    try:
        return int(command_function(args.func)(args) or 0)
    except KeyboardInterrupt:
        print("cels: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `cels status | head`: the reader has all it wanted; nothing more goes to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Terminated as exc:  # every output's temporary file is already removed
        print(f"cels: stopped by {exc}", file=sys.stderr)
        return 128 + exc.signum
    except (ValueError, OSError) as exc:  # bad input or parameters: one clear line, no traceback
        print(f"cels {args.command}: error: {exc}", file=sys.stderr)
        return 2
