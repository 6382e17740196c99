"""The DP sampling mechanism: conditions, solvers, noise, sampling, preprocessing, recipe (one
module each; the package imports none of them, so that a module's import pulls in only what
it needs)."""
