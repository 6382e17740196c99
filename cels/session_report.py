"""The initiator's session report (the drivers build it: cels.inprocess, the party node).

The same privacy / solver / utility keys as ``cels sanitize``, plus per-phase costs, from the
initiator's :class:`cels.protocol.stages.results.SessionResult` (docs/protocol.md, "How a
session lives").
"""

from __future__ import annotations

import numpy as np

from cels import metrics
from cels.logs.model import output_sizes
from cels.claims import dp_release_accounting, privacy_accounting
from cels.protocol.stages.dp_release import session_accounting
from cels.protocol.options import SessionOptions
from cels.protocol.machines import solver_machine
from cels.protocol.wire.codec import phase_label
from cels.protocol.stages.results import SessionResult


def session_privacy(options: SessionOptions, b: float, seeded: bool) -> dict:
    """The session's privacy accounting (cels.claims): the solve mode is the threat-model row;
    ``seeded``: the draws were replayed from a seed."""
    return privacy_accounting(
        epsilon=options.epsilon, delta=options.delta, b=b, bound=options.bound, noise_epsilon=options.noise_epsilon,
        sensitivity=options.sensitivity, cap=options.cap, setting=options.solve, seeded=seeded,
    )


def session_phases(result: SessionResult) -> dict[str, dict]:
    """Each phase's seconds and bytes per node, and their totals, from every StepReport."""
    phases: dict[str, dict] = {}
    for rep in result.step_reports:
        entry = phases.setdefault(phase_label(rep.phase), {"seconds": {}, "bytes": {}})
        entry["seconds"][rep.node] = rep.seconds
        entry["bytes"][rep.node] = rep.bytes_sent
    for entry in phases.values():
        entry["seconds_total"] = sum(entry["seconds"].values())
        entry["bytes_total"] = sum(entry["bytes"].values())
    return phases


def dp_session_report(result: SessionResult) -> dict:
    """The report of a DP-histogram session (``--release dp``): its accounting per observer,
    the threshold, the released items, the phases."""
    opts, phases = result.options, session_phases(result)
    accounting = session_accounting(opts)
    return {
        "method": "cels-dp-histogram",
        "privacy": dp_release_accounting(accounting, parties=len(opts.parties), seeded=result.seeded),
        "release": {"kind": opts.release, "threshold": result.output.threshold, "items": len(result.output)},
        "sizes": {"parties": len(opts.parties), "output_items": len(result.output)},
        "universe_cipher": opts.universe_cipher,
        "phases": phases,
        "bytes_total": int(sum(e["bytes_total"] for e in phases.values())),
    }


def session_report(result: SessionResult) -> dict:
    """The report of a finished session (the keys ``cels run`` and the tests read): its release kind's."""
    return result.options.release_kind.report(result)


def sampled_session_report(result: SessionResult) -> dict:
    """The report of a sampled-release session: privacy given the counts, the solve, utility, the phases."""
    phases = session_phases(result)
    opts, counts, solved, output = result.options, result.counts, result.solved, result.output
    x_all = np.zeros(counts.n, dtype=np.min_scalar_type(int(solved.x.max(initial=0))))  # x over the index in its smallest type
    x_all[counts.active] = solved.x
    # the cleaned pairs (c_i >= min_count) without a copy of the index where cleaning drops none
    # (the measures skip c_i = 0, and pass over the index in chunks: cels.metrics)
    cleaned = counts.totals if opts.min_count <= 1 else np.where(counts.totals >= opts.min_count, counts.totals, 0)
    solve_cost = phases.get(solver_machine(opts).phases[0], {})  # phase 3, the solver's
    return {
        "method": "cels-protocol",
        "privacy": {**session_privacy(opts, opts.b, result.seeded), "min_count": opts.min_count},
        "solver": solved.solver_report,
        "noise": solved.solver_report.get("noise"),
        "utility": {
            **metrics.utility_report(cleaned, x_all, support=opts.support),
            "against": "the summed pair totals c after the cap (the parties never see the uncapped sum)",
        },
        "sizes": {
            "parties": len(opts.parties),
            "pairs": int(counts.n),
            "unique_pairs": counts.unique_pairs,
            "nonunique_pairs": int(len(counts.active)),
            **(
                {"constraint_rows": dict(zip(opts.parties, solved.constraint_rows)), "ell": solved.ell}
                if solved.constraint_rows is not None
                else {}  # the private solve tells no party another party's number of rows
            ),
            **output_sizes(output),
        },
        "sampling": {"mode": opts.sampling, "stages": result.sampled.stages, "theta": opts.sampling_theta},
        "solve": {
            "mode": opts.solve,
            **({"rounds": solved.solver_report["rounds"], "round_batch": opts.round_batch} if opts.solve == "private" else {}),
            "bytes": solve_cost.get("bytes_total", 0),
            "seconds": solve_cost.get("seconds_total", 0.0),
        },
        "universe_cipher": opts.universe_cipher,
        "key_bits": opts.key_bits,
        "group_bits": opts.group_bits,
        "phases": phases,
        "bytes_total": int(sum(e["bytes_total"] for e in phases.values())),
    }
