# One image for every CELS node (cels-party, cels-solver), the `cels` CLI (certs, run), the
# readiness probe (python -m cels.node.health) and Ray (the `ray` extra: `ray start` for the
# compose `cluster` profile's head and worker, the client a party node joins them with);
# docs/deployment.md.
#
#   docker build -t cels:dev .                    # base python:3.11-slim, packages from PyPI
#   docker build -t cels:dev --build-arg BASE_IMAGE=cels-base:bookworm \
#       --build-arg WHEELHOUSE=build/compose-test/wheelhouse .   # offline (make compose-test)
#
# BASE_IMAGE: any image with python3 (>= 3.10) and its venv module.  WHEELHOUSE: a directory
# in the build context holding wheels of every dependency plus setuptools and wheel
# (`pip wheel '.[ray]' setuptools wheel -w DIR`); pip then installs with --no-index from it.  The
# project is installed into the virtual environment /opt/cels in a build stage, so the
# wheelhouse never reaches the final image.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS install
ARG WHEELHOUSE=
ENV PYTHONDONTWRITEBYTECODE=1
COPY . /src
RUN python3 -m venv /opt/cels \
    && /opt/cels/bin/pip install --no-cache-dir ${WHEELHOUSE:+--no-index --find-links=/src/${WHEELHOUSE}} '/src[ray]'

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/cels/bin:${PATH}
COPY --from=install /opt/cels /opt/cels
# the cels user (uid 1000) owns the mount points: a named volume mounted there starts with
# this ownership, so the nodes can write certificates and outputs without root (and the compose
# cluster profile's Ray head its token, ~/.ray/auth_token; a party its ledger and the ledger's
# key, /ledger, 0700)
RUN useradd --create-home --uid 1000 --user-group cels \
    && mkdir -p /certs /out /data /home/cels/.ray /ledger \
    && chown cels:cels /certs /out /home/cels/.ray /ledger \
    && chmod 0700 /ledger
USER cels
WORKDIR /home/cels
