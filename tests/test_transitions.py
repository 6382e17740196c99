"""The roles' transition tables are the machine (cels.protocol.machines; docs/protocol.md, "How a session lives").

Read from the tables themselves: every step message a table names is one of the one protocol
schema; every (message, phase) pair outside a table's cells is refused without changing the
role; every phase a table names is reached by a real session, in the table's order; each
message is charged to one phase per session; and docs/protocol.md shows the tables as they are."""

from __future__ import annotations

import pytest

from cels.inprocess import InMemoryNetwork, session_hosts, start_session
from cels.logs import synthetic_log
from cels.protocol.options import SessionOptions
from cels.protocol.hosted import HOST_STEPS
from cels.protocol.machines import PARTY, SESSION_CHARGES, SOLVER
from cels.protocol.party import PartyRole
from cels.protocol.phases import Phase
from cels.protocol.roles import ProtocolError
from cels.protocol.solver import SolverRole
from cels.protocol.wire import cels_pb2

TEST_KEYS = {"key_bits": 256, "group_bits": 1024}
ROLE_PHASES = [p for p in Phase if p not in (Phase.CONTROL, Phase.START)]
HOST_TAKES = {"start_session": "any phase (the host)", "abort": "any phase (the host)", "approval": "the initiator, prepared (the host)",
              "resume_from": "a re-run, begun (the host)"}
"""Step messages the host or every role takes whatever the phase (not rows of a role's table)."""
STEPS = [f.name for f in cels_pb2.Envelope.DESCRIPTOR.oneofs_by_name["step"].fields]


def roles(mode: str) -> tuple[SessionOptions, dict[str, object]]:
    kind = {"release": "dp", "delta": 1e-3} if mode == "dp" else {"solve": mode, "delta": 0.9}
    options = SessionOptions.create(3, epsilon=8.0, session_id=f"table-{mode}", **kind, **TEST_KEYS)
    log = synthetic_log(seed=3, users=30)
    shares = log.split_by_user(3)
    made = {p: PartyRole(p, options, shares[k], allow_insecure_key_bits=True) for k, p in enumerate(options.parties)}
    made[options.solver] = SolverRole(options.solver, options, allow_insecure_key_bits=True)
    return options, made


MACHINES = [*PARTY.values(), *SOLVER.values()]


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_every_cell_names_a_step_of_the_schema_and_a_role_phase(machine) -> None:
    assert set(machine.rows) <= set(ROLE_PHASES)
    for phase, row in machine.rows.items():
        assert set(row.takes) <= set(STEPS), (phase, set(row.takes) - set(STEPS))
        assert row.then is None or row.then in machine.rows, (phase, row.then)


@pytest.mark.parametrize("name", sorted(SESSION_CHARGES))
def test_every_step_of_a_session_is_charged_to_one_phase(name) -> None:
    """The mask keys are taken from the universe on but charged where they are used: the
    private solve's in the solve, the DP release's in the counts (one rule, from the tables)."""
    charged = SESSION_CHARGES[name]
    taken = {step for m in (PARTY[name], SOLVER[name]) for row in m.rows.values() for step in row.takes}
    assert taken <= set(charged)
    if "mask_key" in charged:
        assert charged["mask_key"] is {"private": Phase.SOLVE, "dp": Phase.COUNTS}[name]
    assert charged["dp_items" if name == "dp" else "step_report"] is (Phase.OVER if name == "dp" else Phase.CONTROL)


@pytest.mark.parametrize("mode", ["private", "transformed", "dp"])
@pytest.mark.parametrize("node", ["party-2", "solver"])
def test_every_pair_outside_a_row_is_refused_and_changes_nothing(mode, node) -> None:
    options, made = roles(mode)
    role = made[node]
    sender = "party-1" if node != "party-1" else "party-2"
    refused = 0
    for step in STEPS:
        if step in HOST_STEPS:
            continue
        for phase in ROLE_PHASES:
            if step in getattr(role.machine.rows.get(phase), "takes", {}):
                continue
            role.phase = phase
            envelope = cels_pb2.Envelope(session_id=options.session_id, sender=sender, **{step: getattr(cels_pb2, type(getattr(cels_pb2.Envelope(), step)).__name__)()})
            with pytest.raises(ProtocolError) as err:
                role.receive(sender, envelope)
            assert err.value.code == ProtocolError.FAILED_PRECONDITION, (step, phase, str(err.value))
            assert role.phase == phase and role.aborted is None, (step, phase)
            refused += 1
    assert refused > len(STEPS)  # the loop refused something for every step outside the rows


MODE_PHASES = {
    ("private", PartyRole): {Phase.LOAD, Phase.UNIVERSE, Phase.COUNTS, Phase.SOLVE, Phase.SAMPLING, Phase.UNION, Phase.OVER},
    ("transformed", PartyRole): {Phase.LOAD, Phase.UNIVERSE, Phase.COUNTS, Phase.NLP, Phase.SAMPLING, Phase.UNION, Phase.OVER},
    ("dp", PartyRole): {Phase.LOAD, Phase.UNIVERSE, Phase.COUNTS, Phase.OVER},
    ("private", SolverRole): {Phase.SOLVE}, ("transformed", SolverRole): {Phase.NLP}, ("dp", SolverRole): {Phase.UNIVERSE, Phase.COUNTS},
}  # fmt: skip
"""The phases a role goes through in each mode (the sampled release's two solves, the DP release)."""


@pytest.mark.parametrize("mode", ["private", "transformed", "dp"])
def test_every_phase_a_row_names_is_reached_by_a_session(mode) -> None:
    kind = {"release": "dp", "delta": 1e-3} if mode == "dp" else {"solve": mode, "delta": 0.9}
    options = SessionOptions.create(3, epsilon=8.0, **kind, **TEST_KEYS)
    log = synthetic_log(seed=3, users=30)
    network = InMemoryNetwork(session_hosts(log.split_by_user(3), options, allow_insecure_key_bits=True))
    ended = start_session(network, options)
    for node, role in ended.items():
        reached = set(role.seconds) | {Phase.READY, role.phase}  # left (charged) phases, the first and the last
        assert role.phase is Phase.OVER, (node, role.phase)
        assert set(role.machine.rows) == MODE_PHASES[mode, type(role)], (node, role.machine.name)
        assert set(role.machine.rows) <= reached, (node, set(role.machine.rows) - reached)


def test_an_abort_reaches_failed() -> None:
    options, made = roles("private")
    role = made["party-2"]
    abort = cels_pb2.Abort(session_id=options.session_id, origin="party-1", kind=cels_pb2.Abort.DIED, reason="stopped answering", phase=cels_pb2.PHASE_LOAD)
    role.receive("party-1", cels_pb2.Envelope(session_id=options.session_id, sender="party-1", abort=abort))
    assert role.phase is Phase.FAILED and role.aborted.origin == "party-1"


def table_markdown() -> str:
    """The roles' transition tables as docs/protocol.md shows them ("How a session lives"):
    where each step message is taken, per machine (the sampled release's two solves, the DP release)."""
    names = list(PARTY)
    rows = ["| step message | " + " | ".join(f"a party ({n})" for n in names) + " | " + " | ".join(f"the solver ({n})" for n in names) + " |",
            "| --- |" + " --- |" * (2 * len(names))]
    for step in STEPS:
        if step in HOST_STEPS:
            cells = [HOST_TAKES[step]] * len(names) + [HOST_TAKES[step] if step != "approval" else "refused"] * len(names)
        else:
            cells = [", ".join(p.value for p in m.taken_in(step)) or "refused" for m in [*PARTY.values(), *(SOLVER[n] for n in names)]]
        rows.append(f"| `{step}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def test_docs_show_the_tables_as_they_are() -> None:
    from pathlib import Path

    assert table_markdown() in (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()


def next_markdown() -> str:
    """The party's phase order per machine as docs/protocol.md shows it: after each phase, the next."""
    rows = ["| machine | when the phase machine of | has its result, the party keeps it as | and enters |", "| --- | --- | --- | --- |"]
    for name, machine in PARTY.items():
        for phase, row in machine.rows.items():
            if phase is not Phase.OVER:
                rows.append(f"| {name} | {phase.value} | {f'`{row.keep}`' if row.keep else '-'} | {(row.then or Phase.OVER).value} |")
    return "\n".join(rows)


def test_docs_show_the_party_phase_order_as_it_is() -> None:
    from pathlib import Path

    assert next_markdown() in (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
