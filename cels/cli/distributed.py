"""The flags of ``cels certs``, ``cels run`` and ``cels simulate``: CELS as a distributed service.

- ``cels certs --out DIR --parties R``: a development CA and one certificate per node.
- ``cels ray-tls --ca DIR --name NAME --out DIR [--client]``: a certificate of the party's own
  Ray CA for a Ray host, or the party node (cels.engine.ray.tls).
- ``cels run --config session.toml``: start a session on running nodes (the initiator is a
  party node); the release and its public release note are written where ``[run] output``
  says, the confidential operator report where ``[run] report`` says (default: cels.reports).
- ``cels simulate``: split a log by user over R parties, start R party nodes and a solver node
  as separate processes on 127.0.0.1 with a fresh dev CA, run one session, stop them.

Reading the flags loads no gRPC, numpy or solver: each command's ``func`` names the function
that runs it (:mod:`cels.cli.run`, :mod:`cels.cli.simulate`), imported when it runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from cels.cli.options import DEMO_BUDGET, SESSION_FLAGS, add_force_argument, add_option_arguments, add_seed_argument, delimiter, single_holder_arguments
from cels.engine.options import add_engine_arguments
from cels.logs.formats import FORMATS

if TYPE_CHECKING:
    from cels.protocol.options import SessionOptions

DEFAULT_TIMEOUT = 4 * 3600.0
"""How long ``cels run`` and ``cels simulate`` wait for a session at most (seconds)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    certs = subparsers.add_parser("certs")
    certs.add_argument("--out", required=True, type=Path, help="directory for ca.pem and NAME.pem / NAME.key")
    certs.add_argument("--parties", type=int, default=3, help="number of party nodes (default 3)")
    certs.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    certs.set_defaults(func="cels.cli.run:run_certs")

    ray_tls = subparsers.add_parser("ray-tls")
    ray_tls.add_argument("--ca", required=True, type=Path, help="the party's Ray CA: a directory with ca.pem and ca.key (made, 0700, if it has none)")
    ray_tls.add_argument("--name", required=True, help="whose certificate: a Ray host's (ray-head) or the party node's")
    ray_tls.add_argument("--out", required=True, type=Path, help="directory for tls.pem, tls.key (0600) and ca.pem: RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY, RAY_TLS_CA_CERT")
    ray_tls.add_argument("--client", action="store_true", help="a client's certificate (the party node joining with ray://), naming no address; "
                         "default: this host's, naming NAME, localhost, the host name and every address Ray may advertise")  # fmt: skip
    ray_tls.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    ray_tls.set_defaults(func="cels.cli.run:run_ray_tls")

    run = subparsers.add_parser("run")
    run.add_argument("--config", required=True, type=Path, help="session.toml (see docs/deployment.md)")
    run.add_argument(
        "--resume", metavar="SESSION",
        help="run session SESSION again after a node restart aborted it: every node replays what it took, with the keys it "
        "kept, and goes on from there (the same session.toml; docs/deployment.md, \"Resume after a node restart\")",
    )  # fmt: skip
    add_force_argument(run)
    run.set_defaults(func="cels.cli.run:run_run")

    sim = subparsers.add_parser("simulate")
    sim.add_argument("--parties", type=int, default=3, help="number of parties R (default 3)")
    sim.add_argument("--input", type=Path, help="the log to split by user (default: the embedded synthetic log)")
    sim.add_argument("--synthetic-users", type=int, default=300, metavar="N", help="users of the embedded synthetic log (default 300; a session of a few seconds with 2048-bit keys)")
    sim.add_argument("--synthetic-pairs", type=int, default=200, metavar="N", help="shared pairs of the embedded synthetic log (default 200)")
    sim.add_argument("--format", choices=FORMATS, help="input format (required with --input)")
    sim.add_argument("--columns", help="tsv column mapping, e.g. user=1,query=2,url=4[,count=5] (parquet: column names)")
    sim.add_argument("--no-header", action="store_true", help="the input has no header line")
    sim.add_argument("--delimiter", default="\t", type=delimiter, help="tsv field delimiter, one character (default tab)")
    sim.add_argument("--lenient", action="store_true", help="skip bad lines instead of failing")
    sim.add_argument("--encoding", default="utf-8", help="how the log bytes are text (default utf-8; e.g. latin-1): a line not valid in it is an error naming file, line and field")
    add_option_arguments(sim, SESSION_FLAGS, DEMO_BUDGET)
    sim.add_argument("--out", required=True, type=Path, help="directory for sanitized.<ext>, its public release note sanitized.<ext>.release-note.json and the node logs")
    sim.add_argument("--report", type=Path, metavar="REPORT.json", help="the confidential operator report (mode 0600; default: under $CELS_REPORT_DIR or ~/.local/state/cels/reports, never beside the release)")
    sim.add_argument("--record-view", type=Path, metavar="DIR", help="every node records its view of the session under DIR (`cels views DIR`)")
    add_force_argument(sim)
    add_stock_arguments(sim)
    add_engine_arguments(sim)
    add_seed_argument(sim)
    single_holder_arguments(sim)
    sim.set_defaults(func="cels.cli.simulate:run_simulate")


def add_stock_arguments(parser: argparse.ArgumentParser) -> None:
    """The offline phase of a simulated deployment (cels.node.keys)."""
    parser.add_argument(
        "--stock-nlp",
        type=int,
        default=0,
        metavar="N",
        help="offline phase: every party stocks N obfuscators for the solver's node key (the NLP of --solve transformed) before the session starts",
    )
    parser.add_argument(
        "--stock-sum",
        type=int,
        default=0,
        metavar="N",
        help="offline phase: every party stocks N obfuscators for P_1's node key (the secure sums of --solve transformed) before the session starts",
    )


def session_stock(args: argparse.Namespace, options: SessionOptions) -> dict[str, int] | None:
    """Key owner -> stock size for the keys a session encrypts under (None: no offline phase).
    Only the paper's mode (--solve transformed) encrypts with Paillier; the private mode masks
    its sums and solve (docs/protocol.md), so neither stock is filled for it."""
    if args.stock_nlp < 0 or args.stock_sum < 0:
        raise ValueError("--stock-nlp / --stock-sum must be >= 0")
    if options.solve != "transformed":
        return None
    stock = {options.parties[0]: args.stock_sum, options.solver: args.stock_nlp}
    return {owner: n for owner, n in stock.items() if n > 0} or None
