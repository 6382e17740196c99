# Every target sets up its own virtual environment from nothing (python3 -m venv + pip).
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-stamp

.PHONY: demo test faults audit cluster venv proto bench clean compose-test lock audit-deps docs readme

LOCK = deploy/lock/test.txt

## the environment comes from the hashed lock (every version and file chosen, not drifted), then
## the project itself without dependencies; make lock refreshes the lock (docs/deployment.md,
## "Dependencies")
## (pip's output goes to $(VENV)/pip.log, shown only if an install fails)
$(STAMP): pyproject.toml $(LOCK)
	@echo "setting up $(VENV) from $(LOCK) (pip's output: $(VENV)/pip.log) ..."
	@$(PYTHON) -m venv $(VENV)
	@$(call quiet-pip,--upgrade pip)
	@$(call quiet-pip,--require-hashes -r $(LOCK))
	@$(call quiet-pip,--no-deps -e .)
	@touch $(STAMP)
## make demo needs only the core lock (no Ray, no pyarrow, no test tools): a venv made by
## make test serves it too
CORE_LOCK = deploy/lock/core.txt
DEMO_STAMP = $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml $(CORE_LOCK)
	@if [ -f $(STAMP) ]; then touch $(DEMO_STAMP); else \
		echo "setting up $(VENV) from $(CORE_LOCK) (pip's output: $(VENV)/pip.log) ..." && \
		$(PYTHON) -m venv $(VENV) && \
		$(call quiet-pip,--upgrade pip) && \
		$(call quiet-pip,--require-hashes -r $(CORE_LOCK)) && \
		$(call quiet-pip,--no-deps -e .) && \
		touch $(DEMO_STAMP); fi
quiet-pip = $(PY) -m pip install --quiet $(1) > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }

venv: $(STAMP)

## make demo: the distributed service on one machine: 3 party nodes + 1 solver node as
## processes on 127.0.0.1 (mutual TLS, 2048-bit keys) sanitize the embedded synthetic log,
## first as the sampled log, then as the DP histogram (docs/releases.md)
demo: $(DEMO_STAMP)
	$(VENV)/bin/cels simulate --parties 3 --out demo-out/sampled --force
	$(VENV)/bin/cels simulate --parties 3 --release dp --synthetic-users 3000 --out demo-out/dp --force

## make lock: re-resolve deploy/lock/test.txt (CI and make test: every extra),
## deploy/lock/image.txt (the image: the ray extra) and deploy/lock/core.txt (make demo) with hashes, by pip-tools in a throwaway venv
lock:
	$(PYTHON) -m venv build/lock-tools
	build/lock-tools/bin/pip install --quiet pip-tools pip-audit
	build/lock-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
		--extra test --extra ray --extra parquet -o deploy/lock/test.txt pyproject.toml
	build/lock-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
		--extra ray -o deploy/lock/image.txt pyproject.toml
	build/lock-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links \
		-o deploy/lock/core.txt pyproject.toml

## make audit-deps: pip-audit over each lock (PyPI's advisories; a version PyPI does not know is
## reported as not audited; one run per lock: pip-audit refuses a package pinned in two files)
audit-deps:
	test -x build/lock-tools/bin/pip-audit || { $(PYTHON) -m venv build/lock-tools && build/lock-tools/bin/pip install --quiet pip-tools pip-audit; }
	for lock in deploy/lock/test.txt deploy/lock/image.txt deploy/lock/core.txt; do \
		build/lock-tools/bin/pip-audit --disable-pip --no-deps --progress-spinner off -r $$lock || exit 1; done

## make test: the whole test suite (real-data tests read $$CELS_DATA, default ../shared/data)
test: $(STAMP)
	$(PY) -m pytest -q --durations=15

## make faults: the whole fault suite (tests/faults: kill matrix, fuzzing with 10,000 messages,
## load, slow network, bad logs, restart) on real node processes; prints the kill table and a
## JSON summary line (FAULTS-SUMMARY; CELS_FAULTS_SUMMARY=FILE also writes it to FILE)
faults: $(STAMP)
	CELS_FAULTS_FUZZ=10000 $(PY) -m pytest -q -p no:cacheprovider \
		-m "faults_long or not faults_long" tests/faults

## make audit: the empirical privacy audit with more draws and neighbours (tests/test_privacy_audit.py and the DP
## histogram's tests/test_dp_audit.py,
## the audit_long cases too: every user of the sampling log, more d / eps' / r, the repair on the real
## AOL slice in $$CELS_DATA); prints one AUDIT-SUMMARY JSON line per audit (docs/security.md)
audit: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider -m "audit_long or not audit_long" tests/test_privacy_audit.py tests/test_dp_audit.py tests/test_private_solve.py

## make cluster: a party on a real Ray cluster of two raylets on 127.0.0.1 (tests/test_engine_raylets.py), and on a
## cluster with TLS, joined with a client certificate of its CA (tests/test_ray_trust.py); about 3 min
cluster: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m cluster_long tests/test_engine_raylets.py tests/test_ray_trust.py

## make compose-test: docker-compose.yml run for real (deploy/compose-test.sh): a Docker engine
## (installed and started if missing; root), the image built offline, 3 party nodes + a solver
## in containers on 127.0.0.1 sanitize 200 AOL users ($$CELS_DATA), the release audited, all torn down
compose-test: $(STAMP)
	PYTHON=$(abspath $(PY)) bash deploy/compose-test.sh

## make docs: the docs as a site in build/site (MkDocs, strict: a broken link or anchor fails)
docs: $(STAMP)
	$(PY) -m mkdocs build --strict -f deploy/mkdocs.yml

## make readme: README.md's numbers from the benchmarks' JSON in docs/bench (cels/bench/readme.py;
## rerun a benchmark first to change one: docs/performance.md names each command)
readme: $(STAMP)
	$(PY) -m cels.bench.readme

## make proto: regenerate cels/protocol/wire/*_pb2*.py from protos/cels.proto
proto: $(STAMP)
	$(PY) -m cels.protocol.wire.generate

clean:
	rm -rf $(VENV) build *.egg-info
