"""``cels params``: the JSON of the issue's examples."""

from __future__ import annotations

import json

import pytest

from cels.cli import main


def params(capsys, *argv: str) -> dict:
    assert main(["params", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_zealous_example(capsys):
    out = params(capsys, "zealous", "--epsilon", "1", "--delta", "0.001", "--m", "2", "--users", "500000")
    assert (out["lambda"], out["tau"], out["tau_prime"]) == (4.0, 4, 78.5753)
    assert out["tau_prime_run"] == 79 and out["delta_run"] <= 0.001


def test_zealous_indistinguishability_and_retention(capsys):
    out = params(
        capsys, "zealous", "--mode", "indistinguishability", "--epsilon", "2", "--delta", "1.40e-8", "--m", "5"
    )
    assert (out["tau"], out["lambda"]) == (1, 5.0)
    assert out["tau_prime"] == pytest.approx(100.0, abs=0.01)  # Table 1, lambda = 5
    out = params(
        capsys, "zealous", "--epsilon", "1", "--delta", "0.001", "--m", "2", "--users", "500000", "--count", "78.5753"
    )
    assert out["retention_probability"] == 0.5


def test_korolova_example(capsys):
    out = params(capsys, "korolova", "--epsilon", "2.302585093", "--delta", "1e-5", "--d", "40")
    assert (round(out["K"], 2), round(out["b"], 2)) == (292.04, 17.37)
    assert out["K_run"] == 293 and out["delta"] <= 1e-5


def test_safelog_example(capsys):
    out = params(capsys, "safelog", "--K", "10", "--b", "10", "--bq", "10", "--bc", "10", "--qf", "100", "--cf", "100")
    assert round(out["epsilon"], 2) == 42.73
    assert out["pool_release_probability"] == 0.1839
    out = params(
        capsys,
        "safelog",
        "--K",
        "10",
        "--b",
        "10",
        "--bq",
        "10",
        "--bc",
        "10",
        "--bt",
        "10",
        "--qf",
        "100",
        "--cf",
        "100",
    )
    assert round(out["epsilon_without_transitions"], 2) == 42.73
    assert round(out["epsilon_with_transitions"], 2) == 52.63


def test_bad_parameters_exit_2_with_one_line(capsys):
    assert main(["params", "zealous", "--epsilon", "1", "--delta", "2", "--m", "2", "--users", "10"]) == 2
    err = capsys.readouterr().err
    assert "delta must lie in (0, 1)" in err and err.count("\n") == 1
    assert main(["params", "safelog", "--qf", "5", "--cf", "5"]) == 2
    assert "give --epsilon" in capsys.readouterr().err
