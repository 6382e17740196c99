"""Fig. 6 (CELS 6.5): total time of a CELS session vs the number of parties r and vs the input
size, from the in-memory distributed runner (:func:`cels.inprocess.run_session`: every
party and the solver run their real roles and crypto in one process; bytes are the serialized
messages).  Time is the session's CPU time in that one process (``cpu_seconds``, plotted: the
sum of all parties' and the solver's work, as the paper's "overall computation cost", and
unaffected by other jobs on the machine) next to its wall time (``seconds``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tqdm import tqdm

from cels.experiments import common
from cels.experiments.common import Dataset, panels, save_figure
from cels.inprocess import run_session
from cels.protocol.options import SessionOptions

FIG6_KEY_BITS = 512  # the paper's Paillier key for Fig. 6 / Table 5; NOT a secure size
FIXED_R = 6  # the paper's "fixed number of parties (e.g., 6 parties)"



def measure(
    cases: list[tuple[Dataset, int]],
    *,
    epsilon: float,
    delta: float,
    key_bits: int = FIG6_KEY_BITS,
    group_bits: int = 2048,
    universe_cipher: str = "x25519",
    seed: int = 0,
    progress: bool = True,
) -> list[dict]:
    """One session per (dataset, r): users split by :meth:`SearchLog.split_by_user` (seeded)."""
    rows = []
    for dataset, r in tqdm(cases, desc="sessions", unit="session", disable=None if progress else True):
        config = SessionOptions.create(
            r, epsilon=epsilon, delta=delta, key_bits=key_bits, group_bits=group_bits, universe_cipher=universe_cipher,
            solve="transformed",  # Fig. 6 / Table 5 measure the paper's Algorithm 2
        )
        cpu = time.process_time()
        out, report = run_session(dataset.log.split_by_user(r, seed), config, allow_insecure_key_bits=key_bits < 2048)
        cpu = time.process_time() - cpu
        sent = report["network"]["bytes_by_node"]
        party_bytes = [v for k, v in sent.items() if k != config.solver]
        rows.append(
            {
                **dataset.facts(),
                "parties": r,
                "key_bits": key_bits,
                "group_bits": group_bits,
                "universe_cipher": universe_cipher,
                "seconds": report["wall_seconds"],
                "cpu_seconds": cpu,
                "bytes_total": report["bytes_total"],
                "megabytes_total": report["bytes_total"] / 1e6,
                "party_bytes_min": min(party_bytes),
                "party_bytes_max": max(party_bytes),
                "messages": report["network"]["messages"],
                **{f"seconds_{phase}": v["seconds_total"] for phase, v in report["phases"].items()},
                **{f"bytes_{phase}": v["bytes_total"] for phase, v in report["phases"].items()},
                "output_size": out.size,
            }
        )
    return rows


def plot(rows: list[dict], path: Path, fixed_r: int) -> None:
    """(a) seconds vs r per input; (b) seconds vs |D| at r = fixed_r."""
    fig, axes = panels(2)
    labels = list(dict.fromkeys(r["dataset"] for r in rows))
    for label in labels:
        sel = sorted((r for r in rows if r["dataset"] == label), key=lambda r: r["parties"])
        if len(sel) > 1:
            axes[0, 0].plot([r["parties"] for r in sel], [r["cpu_seconds"] for r in sel], marker="o", label=label)
    for name in dict.fromkeys(r["dataset"].split("-")[0] for r in rows):
        sel = sorted((r for r in rows if r["parties"] == fixed_r and r["dataset"].startswith(name)), key=lambda r: r["input_size"])
        axes[0, 1].plot([r["input_size"] for r in sel], [r["cpu_seconds"] for r in sel], marker="o", label=f"{name}, r = {fixed_r}")
    axes[0, 0].set_xlabel("parties r")
    axes[0, 1].set_xlabel("input size |D|")
    for ax in axes[0]:
        ax.set_ylabel("session CPU time (s, one process)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"Fig. 6: CELS session time (Paillier {rows[0]['key_bits']} bits, in-memory network)", fontsize=10)
    save_figure(fig, path)


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default=None, metavar="DIR", help="directory of the real logs (default $CELS_DATA or ../shared/data)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="epsilon of the sessions (default 1; cost hardly depends on it)")
    parser.add_argument("--delta", type=float, default=0.5, help="delta of the sessions (default 0.5: b = 0.5)")
    parser.add_argument("--key-bits", type=int, default=FIG6_KEY_BITS, help="Paillier key bits (default 512 as the paper; 2048 is secure)")
    parser.add_argument("--group-bits", type=int, default=2048, choices=(2048, 3072), help="Pohlig-Hellman group bits")
    parser.add_argument("--universe-cipher", default="x25519", choices=("x25519", "pohlig-hellman"), help="commutative hash of the pair ids")
    parser.add_argument("--parties", default="2,4,6,8,10", help="numbers of parties r (comma list)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_session_arguments(parser)
    parser.add_argument("--msnbc-users", default="1000,250,500", help="MSNBC inputs (first N users); the first one also gets the r sweep")
    parser.add_argument("--aol-users", default="100,250,500", help="AOL inputs (first N users, cleaned); the first one also gets the r sweep")
    parser.add_argument("--fixed-r", type=int, default=FIXED_R, help="parties of the input-size sweep (default 6)")


def session_kwargs(args: argparse.Namespace) -> dict:
    return {
        "epsilon": args.epsilon, "delta": args.delta, "key_bits": args.key_bits, "group_bits": args.group_bits,
        "universe_cipher": args.universe_cipher, "seed": args.seed, "progress": not args.quiet,
    }  # fmt: skip


def run(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    parties = common.int_list(args.parties, "--parties")
    datasets = common.datasets_from_args(args)
    first = {}
    for d in datasets:
        first.setdefault(d.name, d)
    cases = [(d, r) for d in first.values() for r in parties]
    cases += [(d, args.fixed_r) for d in datasets if (d.label, args.fixed_r) not in {(c.label, r) for c, r in cases}]
    rows = measure(cases, **session_kwargs(args))
    plot(rows, out_dir / "fig6.png", args.fixed_r)
    return rows
