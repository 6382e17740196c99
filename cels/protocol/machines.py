"""Every role's machine, one transition table each (docs/protocol.md, "How a session lives").

As in h11's ``_state.py``, the whole protocol's control flow is here and nowhere else.  A
machine is a table ``phase -> row``: the step messages the role takes in that phase (each to
its handler; anything else is refused and changes nothing), and, once the phase's work has its
result, the phase it enters next (``then``; none: the role's part is over).  A party builds
each phase's machine (cels.protocol.stages) from the previous phase's result (``build``) and
keeps that result where a later phase needs it (``keep``).  A session runs the party and
solver machines its release kind names (cels.protocol.releases: the sampled release's solve mode, or
the DP histogram's); which phase each step message is charged to is read from the same tables
(:func:`charges`).

Adding a phase is a row here, a member of cels.protocol.phases.Phase (and its wire value in
protos/), and its phase machine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase
from cels.protocol.rolebase import Charges, Machine, PhaseRow, Takes, charges
from cels.protocol.roles import Outgoing
from cels.protocol.stages.counts import Counts
from cels.protocol.stages.dp_release import NoisyCounts
from cels.protocol.stages.private import PrivateSolve
from cels.protocol.stages.sampling import Sampling
from cels.protocol.stages.sums import MaskedSums
from cels.protocol.stages.transformed import TransformedSolve
from cels.protocol.stages.union import Union
from cels.protocol.stages.universe import Load, Universe

Handler = Callable[[Any, str, Any], list[Outgoing]]


def method(name: str) -> Handler:
    """A cell's handler that is the role's own method ``name`` (cels.protocol.party.PartyRole,
    cels.protocol.solver.SolverRole: named, so that the roles can import their tables)."""

    def handle(the_role: Any, sender: str, message: Any) -> list[Outgoing]:
        return getattr(the_role, name)(sender, message)

    handle.__name__ = name
    return handle


def step(handler: Callable[..., list[Outgoing]]) -> Handler:
    """A cell's handler that is the running phase machine's ``handler``; then the party's
    phase moves if the machine has its result (cels.protocol.party.PartyRole._moved)."""

    def run(party: Any, sender: str, message: Any) -> list[Outgoing]:
        return party._moved(handler(party.stage, sender, message))

    run.__name__ = handler.__name__
    return run


# -- the party: P_k (CELS section 4.2) -------------------------------------------------------------
SUMS = Takes(method("_on_sum_message"), whole=True, by_sum_id=True)
"""The secure sums' messages: the counts' sums or the sampling's, by their sum id."""
RING = {"sum_key": SUMS, "sum_hop": SUMS, "sum_result": SUMS, "masked_sum_share": SUMS}
REPORTS = {"step_report": Takes(method("_on_step_report"))}
"""The initiator takes every node's StepReports from its universe on."""
UNION = Takes(step(Union.on_message), whole=True)


def mask_keys(charged: Phase) -> dict[str, Takes]:
    """The pairwise mask keys, sent at begin: taken from the universe on, charged to the phase that uses them."""
    return {"mask_key": Takes(method("_on_mask_key"), charged=charged)}


LOAD = PhaseRow({}, then=Phase.UNIVERSE, keep="loaded", build=lambda role, _: Load(role.seat, role.work))
UNIVERSE_TAKES = {
    "universe_hop": Takes(step(Universe.on_hop)),
    "universe_index": Takes(step(Universe.on_index)),
    **REPORTS,
}


def build_universe(role: Any, loaded: Any) -> Universe:
    return Universe(role.seat, role.work, role._hash, loaded, role.dummies)


def sampled_party(name: str, solve: Phase) -> Machine:
    """The sampled release (CELS): the universe, the counts, phase 3 (``solve``: the private
    solve or Algorithm 2), the sampling, the union; the initiator keeps the output."""
    private = solve is Phase.SOLVE
    keys = mask_keys(Phase.SOLVE) if private else {}
    third = (
        {"round_verdict": Takes(step(PrivateSolve.on_round_verdict)), "noise_total": Takes(step(PrivateSolve.on_noise_total)),
         "transcript_digest": Takes(step(PrivateSolve.on_transcript_digest))}
        if private else
        {name: Takes(step(getattr(TransformedSolve, f"on_{name}"))) for name in ("nlp_key", "nlp_sum_hop", "nlp_permute_hop", "nlp_solution")}
    )  # fmt: skip
    solve_class = PrivateSolve if private else TransformedSolve
    return Machine(
        name,
        {
            Phase.LOAD: LOAD,
            Phase.UNIVERSE: PhaseRow({**UNIVERSE_TAKES, **keys}, then=Phase.COUNTS, build=build_universe),
            # the universe's result (c^k over the index) goes to the counts' first sum only
            Phase.COUNTS: PhaseRow({**RING, **keys, **REPORTS}, then=solve, keep="counted",
                                   build=lambda role, r: Counts(role.seat, role.work, role.sums, r)),
            solve: PhaseRow({**third, **keys, **REPORTS}, then=Phase.SAMPLING, keep="solved",
                            build=lambda role, counted: role.kept_solve(solve_class(role.seat, role.work, role.sums, counted, role._rng))),
            Phase.SAMPLING: PhaseRow({**RING, **REPORTS}, then=Phase.UNION, keep="sampled",
                                     build=lambda role, solved: Sampling(role.seat, role.work, role.sums, role.counted, solved)),
            Phase.UNION: PhaseRow({"union_encrypt_hop": UNION, "union_decrypt_hop": UNION, "union_result": UNION, **REPORTS},
                                  keep="united", build=lambda role, r: Union(role.seat, role.work, role.counted, r, role._rng, role.keeping)),
            Phase.OVER: PhaseRow(REPORTS),
        },
        ring=solve_class.sum_ring,
    )  # fmt: skip


DP_PARTY = Machine(
    "dp",
    {
        Phase.LOAD: LOAD,
        Phase.UNIVERSE: PhaseRow({**UNIVERSE_TAKES, **mask_keys(Phase.COUNTS)}, then=Phase.COUNTS, build=build_universe),
        # the items of its kept columns go to the solver; the release comes from the solver
        Phase.COUNTS: PhaseRow(
            {**RING, **mask_keys(Phase.COUNTS), "dp_selection": Takes(step(NoisyCounts.on_dp_selection)), **REPORTS},
            build=lambda role, r: NoisyCounts(role.seat, role.work, role.sums, r, role.draws),
        ),
        Phase.OVER: PhaseRow({"dp_release": Takes(method("_on_dp_release")), **REPORTS}),
    },
    ring=lambda seat, on_total, _setup, draws: MaskedSums(seat, on_total, draws),  # pairwise masks, whatever the solve (it runs none)
)
"""The DP release (cels.protocol.stages.dp_release): the universe, assembled by the solver, then
the noisy counts and the selection: no solve, sampling or union."""

PARTY: dict[str, Machine] = {m.name: m for m in (sampled_party("private", Phase.SOLVE), sampled_party("transformed", Phase.NLP), DP_PARTY)}
"""The party's machines by name: the sampled release's solve modes (cels.protocol.options.SOLVE_MODES), and the DP release's."""

# -- the solver: P_0 (CELS Algorithm 2; the private solve; the DP release's aggregator) ----------------
SOLVER: dict[str, Machine] = {
    "private": Machine("private", {
        Phase.SOLVE: PhaseRow({"masked_verdicts": Takes(method("_on_masked_verdicts")),
                               "masked_noise_share": Takes(method("_on_masked_noise_share"))}),
    }, start="_start_private"),
    "transformed": Machine("transformed", {
        Phase.NLP: PhaseRow({name: Takes(method(f"_on_{name}"))
                             for name in ("constraint_shape", "nlp_slack_block", "nlp_sum_hop", "nlp_permute_hop")}),
    }),
    "dp": Machine("dp", {
        Phase.UNIVERSE: PhaseRow({"universe_hop": Takes(method("_on_complete_ids"))}, then=Phase.COUNTS),
        # not reported: the items' sizes would tell the initiator how many released pairs each party holds
        Phase.COUNTS: PhaseRow({"masked_sum_share": Takes(method("_on_noisy_share"), whole=True, by_sum_id=True),
                                "dp_items": Takes(method("_on_dp_items"), charged=Phase.OVER)}),
    }, start="_start_dp"),
}  # fmt: skip

SESSION_CHARGES: dict[str, Charges] = {name: charges(PARTY[name], SOLVER[name]) for name in SOLVER}
"""Per machine name: the phase each step message of a session is charged to (its sender's bytes)."""


def party_machine(options: SessionOptions) -> Machine:
    """The party's machine for a session's options (its release kind's: cels.protocol.releases)."""
    return PARTY[options.release_kind.machine(options.solve)]


def solver_machine(options: SessionOptions) -> Machine:
    """The solver's machine for a session's options."""
    return SOLVER[options.release_kind.machine(options.solve)]


def session_charges(options: SessionOptions) -> Charges:
    """The phase each step message of a session with these options is charged to."""
    return SESSION_CHARGES[options.release_kind.machine(options.solve)]
