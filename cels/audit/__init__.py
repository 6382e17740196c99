"""Empirical privacy audit of the mechanism's randomised steps (docs/security.md, "Empirical
privacy audit"): a stochastic tester (:mod:`cels.audit.tester`), exact pmfs and losses of the
noise (:mod:`cels.audit.exact`), the audits themselves (:mod:`cels.audit.audits`) and the
claims they back (cels.claims, docs/security.md)."""
