"""``cels views DIR``: summarise recorded views (``--record-view DIR``) per role and draw the
session's sequence diagram (Mermaid text and PNG), see cels.views."""

from __future__ import annotations

import argparse
from pathlib import Path

from cels.fileio import atomic_write, atomic_write_json


def run(args: argparse.Namespace) -> int:
    from cels.views import load_views, mermaid, summarise, summary_markdown
    from cels.views.draw import sequence_png

    sessions = load_views(args.dir)
    for session, views in sorted(sessions.items()):
        out = Path(args.out or args.dir) / session
        out.mkdir(parents=True, exist_ok=True)
        table = summary_markdown(views)
        print(f"## session {session}\n\n{table}")
        with atomic_write(out / "summary.md") as fh:
            fh.write(f"## session {session}\n\n{table}")
        atomic_write_json(out / "summary.json", {node: {"kind": v.kind, "phases": summarise(v)} for node, v in views.items()})
        with atomic_write(out / "sequence.mmd") as fh:
            fh.write(mermaid(views))
        sequence_png(views, out / "sequence.png")
        print(f"wrote {out / 'summary.md'}, summary.json, sequence.mmd, sequence.png\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("views")
    parser.add_argument("dir", metavar="DIR", help="a --record-view directory (DIR/<session>/<node>/view.jsonl)")
    parser.add_argument("--out", default=None, metavar="OUT", help="write summaries and diagrams here (default DIR)")
    parser.set_defaults(func=run)
