"""The three demonstrations of SECURITY.md (cels.attacks, ``cels attack``): their JSON keys and
what the math says each must show.  Test-size keys through the explicit insecure settings."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from cels.attacks import local_sampling, solver_reconstruction, union_origin
from cels.cli import main
from cels.logs import LoadOptions, load_log, synthetic_log

ISSUE_KEYS = {
    "solver-reconstruction": {"rows_recovered_fraction", "cells_recovered_exactly_fraction", "permutation_recovered_fraction"},
    "local-sampling": {"delta", "paper_mode_appearance_probability", "exact_mode_appearance_probability", "tolerance"},
    "union-origin": {"paper_algorithm_attribution_accuracy", "shuffled_union_attribution_accuracy", "chance"},
}


@pytest.fixture(scope="module")
def reconstruction(tmp_path_factory):
    root = tmp_path_factory.mktemp("solver-view")
    result = solver_reconstruction.demonstrate(
        synthetic_log(seed=5, users=60), 3, epsilon=20.0, delta=0.99, key_bits=256, group_bits=1024,
        allow_insecure_key_bits=True, view_dir=root,
    )  # fmt: skip
    return root, result


def test_the_solver_recovers_every_row_and_cell_exactly(reconstruction) -> None:
    _root, result = reconstruction
    assert ISSUE_KEYS["solver-reconstruction"] <= set(result)
    assert result["constraint_rows"] > 10 and result["cells"] > result["constraint_rows"]
    # (AF)^+[AT | AB] = F^-1[T | B] is exact up to the 2^-32 fixed point: every c_ij rounds right
    assert result["rows_recovered_fraction"] == 1.0
    assert result["cells_recovered_exactly_fraction"] == 1.0
    assert result["counts_recovered_exactly"] and result["max_abs_error_ln_t"] < 1e-6
    # matching counts never misidentifies a column and finds at least every column with a unique x
    assert result["misidentified_columns"] == 0
    assert result["permutation_recovered_fraction"] >= result["columns_identifiable_by_x_fraction"] > 0
    assert result["linked_cells"] > 0
    # pruning kept dominated rows away from P_0
    assert result["users_with_rows_at_solver_fraction"] < 1.0


def test_the_attack_needs_only_the_solvers_files(reconstruction, tmp_path) -> None:
    root, result = reconstruction
    (session,) = [p for p in root.iterdir() if p.is_dir()]
    only = tmp_path / "solver"
    shutil.copytree(session / "solver", only)  # nothing of the parties' views
    output = load_log(session / "output.tsv", LoadOptions("histogram"))
    rec, mapping, x = solver_reconstruction.attack(only, output)
    assert rec.cells.shape == (result["constraint_rows"], result["variables"])
    assert len(mapping) == round(result["permutation_recovered_fraction"] * result["released_columns"])
    assert sorted(set(rec.row_party)) == ["party-1", "party-2", "party-3"]


def test_paper_local_sampling_exceeds_delta_and_exact_sampling_does_not() -> None:
    result = local_sampling.demonstrate(runs=3000, seed=7)
    assert ISSUE_KEYS["local-sampling"] <= set(result)
    delta, tol = result["delta"], result["tolerance"]
    assert delta == pytest.approx(1 - 0.95**10, rel=1e-8)  # the tight instance: x = 10, p = 1/20
    assert result["x"] == [10] and result["instance"]["paper_trials_at_chosen_party"] == 1
    # closed forms: exact mode at the bound (b carries a 1e-9 margin), paper mode at p/s = 1/2
    assert result["exact_mode_appearance_probability"] <= delta
    assert result["exact_mode_appearance_probability"] == pytest.approx(delta, rel=1e-8)
    assert result["paper_mode_appearance_probability"] == pytest.approx(0.5)
    assert result["paper_mode_appearance_probability"] > delta + tol
    # the protocol's samplers reproduce both within four standard deviations
    assert abs(result["paper_mode_simulated"] - result["paper_mode_appearance_probability"]) <= tol
    assert abs(result["exact_mode_simulated"] - result["exact_mode_appearance_probability"]) <= tol
    assert result["exact_mode_simulated"] <= delta + tol < result["paper_mode_simulated"]


@pytest.mark.parametrize("parties", [3, 4])
def test_literal_algorithm_3_reveals_every_origin_and_the_shuffled_union_does_not(parties: int) -> None:
    result = union_origin.demonstrate(parties, 40, seed=parties, group_bits=1024, allow_paper_bits=True)
    assert ISSUE_KEYS["union-origin"] <= set(result)
    assert result["same_union"]
    assert result["paper_algorithm_attribution_accuracy"] == 1.0
    assert result["paper_algorithm_records_attributed"] == parties * 40
    assert result["shuffled_union_records_attributed"] == 0
    assert result["chance"] == pytest.approx(1 / (parties - 1))
    # binomial: 4 standard deviations of a uniform guess over the scored records
    assert result["tolerance"] == pytest.approx(4 * math.sqrt(result["chance"] * (1 - result["chance"]) / result["scored_records"]))
    assert abs(result["shuffled_union_attribution_accuracy"] - result["chance"]) <= result["tolerance"]


def test_attack_commands_write_their_json(tmp_path, capsys) -> None:
    out = tmp_path / "local.json"
    assert main(["attack", "local-sampling", "--simulations", "400", "--seed", "1", "-q", "--json", str(out)]) == 0
    assert ISSUE_KEYS["local-sampling"] <= set(json.loads(out.read_text()))
    out = tmp_path / "union.json"
    assert main(["attack", "union-origin", "--records", "12", "--group-bits", "1024", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["paper_algorithm_attribution_accuracy"] == 1.0
    out = tmp_path / "solver.json"
    argv = ["attack", "solver-reconstruction", "--users", "24", "--key-bits", "512", "--group-bits", "1024", "--json", str(out)]
    assert main(argv) == 0
    assert json.loads(out.read_text())["cells_recovered_exactly_fraction"] == 1.0
    assert "NOT secure" in capsys.readouterr().err
    assert main(["attack", "union-origin", "--parties", "2", "--json", str(out)]) == 2


def test_against_the_private_solve_the_solver_recovers_nothing(tmp_path) -> None:
    """Issue 12: the same attack on a private-mode session: the aggregator's view holds no row."""
    out = tmp_path / "private.json"
    argv = ["attack", "solver-reconstruction", "--solve", "private", "--users", "40", "--key-bits", "512",
            "--group-bits", "1024", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["solve"] == "private" and result["cells_recovered"] == 0
    assert result["rows_recovered_fraction"] == 0.0 and result["cells_recovered_exactly_fraction"] == 0.0
    assert set(result["solver_received"]) <= {"masked_verdicts", "step_report", "abort"}
    assert result["solver_received"]["masked_verdicts"] >= 3
