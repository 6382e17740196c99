# One image for every CELS node (cels-party, cels-solver) and the `cels` CLI (certs, run).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY cels ./cels
COPY party_node ./party_node
COPY solver_node ./solver_node
RUN pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 cels \
    && mkdir -p /certs /out && chown cels /certs /out
USER cels
WORKDIR /home/cels
