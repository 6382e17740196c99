#!/usr/bin/env bash
# make compose-test: docker-compose.yml run for real in containers, on a slice of the AOL log.
#
# 1. engine     a Docker engine (Debian's docker.io + docker-compose, installed if missing;
#               dockerd started in the background if none answers, stopped again at the end),
#               and Debian's prometheus (deploy/install-prometheus.sh) for the metrics image
# 2. base       python:3.11-slim if it is here or can be pulled; else cels-base:bookworm, a
#               Debian bookworm image with python3 made by debootstrap + docker import (kept)
# 3. networking can this machine run bridge networks (two containers of the base image on an
#               internal network of their own, one reaching the other by name)?  Then the file
#               runs as shipped, on its own networks.  If not, said loudly: it runs on the
#               host's network (deploy/compose_release.py loopback, deploy/compose-host.yml:
#               nodes on 127.0.0.1), and the step isolation cannot test the networks
# 4. wheelhouse every dependency's wheel (the `ray` extra's too), built on the host (kept while
#               pyproject.toml is unchanged)
# 5. image      cels:dev from the Dockerfile, offline from the wheelhouse; cels-prometheus:dev
#               from deploy/prometheus with the host's prometheus binary copied in
# 6. data       the first $CELS_COMPOSE_USERS users of $CELS_DATA/aol-dev.tsv.gz over 3 parties,
#               the first $CELS_COMPOSE_TRANSFORMED_USERS for the transformed session and the
#               first $CELS_COMPOSE_CLUSTER_USERS for the cluster session
# 7. session    docker-compose.yml + deploy/compose-test.yml (each session's data and outputs),
#               profile metrics: Prometheus (detached), certificates, a solver and three party
#               nodes, `cels run` once all are healthy (deploy/session.toml: the private solve)
# 8. audit      the sanitized log against the slice (deploy/compose_release.py)
# 9. isolation  the running nodes' networks (deploy/compose_probe.py inside the containers):
#               party-1's metrics port answers party-1 itself, but neither the solver nor
#               party-2 reaches it, by name or by its address; nor does the solver reach
#               Prometheus's API on the operator's network (issue 40, finding 6)
# 10. transformed the same with `solve = "transformed"` (Paillier sums, the random-matrix
#               transformation, the solver's NLP) on the smaller slice
# 11. taudit    its audit
# 12. dp        the DP histogram (release = "dp", delta 1e-6) on the first $CELS_COMPOSE_DP_USERS users
#               of MSNBC (default 20000; written as AOL TSV: 17 categories as query-url pairs)
# 13. dpaudit   its audit: every released pair in the input, every count at or above the note's
#               threshold and within the input's distinct users plus the noise's 1e-9 tail
# 14. metrics   Prometheus's API: it scraped every node, saw sessions run on each and the parties leave phases
# 15. cluster   profile cluster: party-1's Ray head and worker (detached, the worker once the head
#               is healthy), then the private session with party-1 on that cluster
#               (deploy/cluster.env: ray://ray-head:7111, 2 shards), ended after
#               $CELS_COMPOSE_CLUSTER_SECONDS; the worker container must have run Ray workers;
#               a stranger's container on the nodes' network, with no token and no
#               certificate, must be refused by the head's client server and its GCS (finding 3)
# 16. caudit    its audit
# and, even when a step fails, the containers, volumes and network go (and a dockerd it started);
# the services' logs stay in $CELS_COMPOSE_WORK/logs (services.log; ray-head/, ray-worker/: Ray's).
#
# Needs root where the engine or debootstrap must be installed or started.  Environment:
# CELS_DATA (default ../shared/data beside the checkout), CELS_COMPOSE_USERS (default 200),
# CELS_COMPOSE_TRANSFORMED_USERS (default 80), CELS_COMPOSE_CLUSTER_USERS (default 200),
# CELS_COMPOSE_CLUSTER_SECONDS (default 300: the cluster session's bound),
# CELS_COMPOSE_WORK (default build/compose-test: wheelhouse, slice, outputs, logs), PYTHON (the
# host Python with the project installed, for the wheelhouse, the slice and the audit).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-python3}
export CELS_DATA=${CELS_DATA:-$(cd .. && pwd)/shared/data}
USERS=${CELS_COMPOSE_USERS:-200}
TRANSFORMED_USERS=${CELS_COMPOSE_TRANSFORMED_USERS:-80}
CLUSTER_USERS=${CELS_COMPOSE_CLUSTER_USERS:-200}
DP_USERS=${CELS_COMPOSE_DP_USERS:-20000}
CLUSTER_SECONDS=${CELS_COMPOSE_CLUSTER_SECONDS:-300}
WORK=$(mkdir -p "${CELS_COMPOSE_WORK:-build/compose-test}" && cd "${CELS_COMPOSE_WORK:-build/compose-test}" && pwd)
PROJECT=cels-compose-test
BASE_IMAGE=python:3.11-slim
DEBIAN_BASE=cels-base:bookworm
# both profiles, so that ps, logs and down see every service; `up run` starts the trigger and
# its dependencies only, so party-1's Ray cluster runs in the cluster step alone.  The step
# networking puts the host-network files in its place where bridge networks cannot run.
compose_files() {  # compose_files -f FILE...: the docker-compose command every step runs, over these files
    COMPOSE=(docker-compose --project-name "$PROJECT" --project-directory "$REPO" "$@" --profile metrics --profile cluster)
}
compose_files -f docker-compose.yml -f deploy/compose-test.yml
NETWORKS=own  # or host: the step networking's verdict
PROMETHEUS_API=127.0.0.1:9090  # the metrics profile's Prometheus (prometheus-operator:9090 resolves to 127.0.0.1)
STARTED_DOCKERD=
NO_ENGINE=77  # exit code when this machine cannot install or start a Docker engine (nothing was tested)
TIMES=()

say() { printf 'compose-test: %s\n' "$*" >&2; }
step() {  # step NAME COMMAND...: run and time one step
    local name=$1 start=$SECONDS
    shift
    say "== $name"
    "$@"
    TIMES+=("$(printf '%-11s %4d s' "$name" $((SECONDS - start)))")
}

teardown() {
    local status=$?
    if docker info >/dev/null 2>&1; then
        "${COMPOSE[@]}" logs --no-color --timestamps >"$WORK/logs/services.log" 2>&1 || true
        local service container
        for service in ray-head ray-worker; do  # Ray's own logs (its client server's among them) stay in the container
            container=$("${COMPOSE[@]}" ps -q "$service" 2>/dev/null) || continue
            [ -z "$container" ] || { rm -rf "$WORK/logs/$service"; docker cp -L "$container:/tmp/ray/session_latest/logs" "$WORK/logs/$service" >/dev/null 2>&1 || true; }
        done
        "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 10 >"$WORK/logs/down.log" 2>&1 || say "docker-compose down failed (see $WORK/logs/down.log)"
    fi
    if [ -n "$STARTED_DOCKERD" ]; then
        kill "$STARTED_DOCKERD" 2>/dev/null && while kill -0 "$STARTED_DOCKERD" 2>/dev/null; do sleep 0.2; done
        say "stopped the dockerd it started (pid $STARTED_DOCKERD)"
    fi
    say "step times:"
    printf '  %s\n' "${TIMES[@]}" >&2
    if [ "$status" -eq 0 ]; then say "PASSED"; else say "FAILED (exit $status; logs in $WORK/logs)"; fi
    exit "$status"
}

need_root() {
    if [ "$(id -u)" != 0 ]; then
        say "$1 needs root (run as root, or provide it yourself)"
        exit 1
    fi
}

engine() {
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
        need_root "installing docker.io and docker-compose"
        if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io docker-compose; } >"$WORK/logs/apt.log" 2>&1; then
            say "installing the engine failed:"; tail -20 "$WORK/logs/apt.log" >&2; exit "$NO_ENGINE"
        fi
    fi
    if ! docker info >/dev/null 2>&1; then
        need_root "starting dockerd"
        dockerd >"$WORK/logs/dockerd.log" 2>&1 &
        STARTED_DOCKERD=$!
        local waited=0
        until docker info >/dev/null 2>&1; do
            if ! kill -0 "$STARTED_DOCKERD" 2>/dev/null || [ $waited -ge 60 ]; then
                say "dockerd did not come up in 60 s:"; tail -20 "$WORK/logs/dockerd.log" >&2; exit "$NO_ENGINE"
            fi
            sleep 1; waited=$((waited + 1))
        done
        say "started dockerd (pid $STARTED_DOCKERD, log $WORK/logs/dockerd.log)"
    fi
    docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}' >&2
    docker-compose version --short >&2
    need_prometheus
}

probe() {  # probe CONTAINER MODE ARGS...: deploy/compose_probe.py inside a running container
    local container=$1
    shift
    docker exec -i "$container" python3 - "$@" <deploy/compose_probe.py
}

networking() {  # the file's own networks where this machine runs bridge networks, else the host's
    local net=$PROJECT-probe verdict
    docker rm -f "$net-listener" >/dev/null 2>&1 || true
    docker network rm "$net" >/dev/null 2>&1 || true
    verdict=$(docker network create --internal "$net" >/dev/null 2>&1 \
        && docker run -d --rm --name "$net-listener" --network "$net" "$BASE_IMAGE" python3 -c "$(cat deploy/compose_probe.py)" listen 9000 >/dev/null 2>&1 \
        && docker run --rm -i --network "$net" "$BASE_IMAGE" python3 - connect "$net-listener" 9000 --wait 20 <deploy/compose_probe.py 2>&1) || verdict="no bridge network: $verdict"
    docker rm -f "$net-listener" >/dev/null 2>&1 || true
    docker network rm "$net" >/dev/null 2>&1 || true
    if [ "$verdict" = REACHED ]; then
        say "bridge networks run here: docker-compose.yml runs on its own networks"
        return
    fi
    NETWORKS=host
    say "WARNING: bridge networks cannot run here ($verdict): docker-compose.yml runs on the host's network, and the isolation of its networks is NOT tested"
    "$PYTHON" deploy/compose_release.py loopback --out "$WORK/compose-loopback.yml"
    compose_files -f "$WORK/compose-loopback.yml" -f deploy/compose-test.yml -f deploy/compose-host.yml
}

isolation() {  # who reaches a node's metrics and Prometheus's API, as the nodes run (finding 6)
    if [ "$NETWORKS" = host ]; then
        say "WARNING: skipped: on the host's network every port is everyone's (step networking)"
        return
    fi
    "${COMPOSE[@]}" up --no-build --detach solver party-1 party-2 party-3 prometheus >/dev/null 2>&1
    local solver party_1 party_2 prometheus metrics_ip operator_ip verdict failed=0
    solver=$("${COMPOSE[@]}" ps -q solver) party_1=$("${COMPOSE[@]}" ps -q party-1) party_2=$("${COMPOSE[@]}" ps -q party-2)
    prometheus=$("${COMPOSE[@]}" ps -q prometheus)
    metrics_ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"${PROJECT}_party-1-metrics\").IPAddress}}" "$party_1")
    operator_ip=$(docker inspect -f "{{(index .NetworkSettings.Networks \"${PROJECT}_operator\").IPAddress}}" "$prometheus")
    expect() {  # expect WANT WHO CONTAINER HOST PORT
        verdict=$(probe "$3" connect "$4" "$5")
        printf 'isolation: %-9s -> %s:%s: %s\n' "$2" "$4" "$5" "$verdict" >&2
        [ "${verdict%% *}" = "$1" ] || { say "$2 should be $1 from $4:$5"; failed=1; }
    }
    expect REACHED party-1 "$party_1" party-1-metrics 9101  # the probe can succeed: the port listens
    expect UNREACHABLE solver "$solver" party-1-metrics 9101
    expect UNREACHABLE solver "$solver" "$metrics_ip" 9101
    expect UNREACHABLE party-2 "$party_2" party-1-metrics 9101
    expect UNREACHABLE party-2 "$party_2" "$metrics_ip" 9101
    expect UNREACHABLE solver "$solver" "$operator_ip" 9090
    [ "$failed" -eq 0 ] || exit 1
}

need_prometheus() {  # the binary the metrics image copies in (the image builds offline)
    command -v prometheus >/dev/null || need_root "installing prometheus"
    bash deploy/install-prometheus.sh "$WORK/logs/apt-prometheus.log"
}

base() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || docker pull -q "$BASE_IMAGE" >"$WORK/logs/pull.log" 2>&1; then
        say "base image $BASE_IMAGE"
        return
    fi
    BASE_IMAGE=$DEBIAN_BASE
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        say "base image $BASE_IMAGE (cached; $BASE_IMAGE cannot be pulled)"
        return
    fi
    need_root "debootstrap"
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >>"$WORK/logs/apt.log" 2>&1
    local root="$WORK/rootfs"
    rm -rf "$root"
    say "no Python image can be pulled: debootstrap bookworm into $root (log $WORK/logs/debootstrap.log)"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip bookworm "$root" >"$WORK/logs/debootstrap.log" 2>&1
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' --change 'ENV LANG=C.UTF-8' \
        --message "debian bookworm minbase + python3 (make compose-test)" - "$BASE_IMAGE" >/dev/null
    rm -rf "$root"
    say "base image $BASE_IMAGE made"
}

wheelhouse() {
    local image_python host_python
    image_python=$(docker run --rm --network none "$BASE_IMAGE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    host_python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$image_python" != "$host_python" ]; then
        say "the wheelhouse is built by the host's Python $host_python but $BASE_IMAGE has Python $image_python: set PYTHON"
        exit 1
    fi
    local wheels=build/compose-test/wheelhouse stamp lock=deploy/lock/image.txt  # the hashed lock of what the Dockerfile installs ('.[ray]')
    stamp="python $host_python, $lock, $(cat pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)"
    if [ -f "$wheels/.stamp" ] && [ "$(cat "$wheels/.stamp")" = "$stamp" ]; then
        say "wheelhouse $wheels (cached: pyproject.toml unchanged)"
        return
    fi
    rm -rf "$wheels"
    # the locked dependencies (their hashes checked), then the build backend; the project itself is
    # built inside the image, where only these wheels can satisfy '.[ray]' (docs/deployment.md, "Dependencies")
    { "$PYTHON" -m pip wheel --quiet --require-hashes --no-deps --wheel-dir "$wheels" -r "$lock" \
        && "$PYTHON" -m pip wheel --quiet --wheel-dir "$wheels" 'setuptools>=77' wheel; } >"$WORK/logs/wheelhouse.log" 2>&1 \
        || { tail -20 "$WORK/logs/wheelhouse.log" >&2; exit 1; }
    rm -f "$wheels"/cels-*.whl
    echo "$stamp" >"$wheels/.stamp"
    say "wheelhouse $wheels: $(ls "$wheels"/*.whl | wc -l) wheels, $(du -sh "$wheels" | cut -f1)"
}

image() {
    docker build --quiet --tag cels:dev --build-arg BASE_IMAGE="$BASE_IMAGE" \
        --build-arg WHEELHOUSE=build/compose-test/wheelhouse . >"$WORK/logs/build.log" 2>&1 \
        || { tail -30 "$WORK/logs/build.log" >&2; exit 1; }
    docker run --rm --network none cels:dev cels --help >/dev/null
    say "image cels:dev on $BASE_IMAGE: $(docker image inspect cels:dev --format '{{.Size}}' | awk '{printf "%.0f MB", $1 / 1e6}')"
    local context="$WORK/prometheus-context"
    rm -rf "$context" && mkdir -p "$context/bin"
    cp deploy/prometheus/Dockerfile deploy/prometheus/prometheus.yml "$context/"
    cp "$(command -v prometheus)" "$context/bin/prometheus"
    docker build --quiet --tag cels-prometheus:dev --build-arg BASE_IMAGE="$BASE_IMAGE" "$context" >"$WORK/logs/build-prometheus.log" 2>&1 \
        || { tail -30 "$WORK/logs/build-prometheus.log" >&2; exit 1; }
    rm -rf "$context"
    say "image cels-prometheus:dev: $(docker run --rm --network none cels-prometheus:dev --version 2>&1 | head -1)"
}

data() {  # one slice, session.toml and output directory per session ($CELS_COMPOSE_RUN suffix)
    local run users
    for run in "" -transformed -cluster -dp; do
        case $run in
            -transformed) users=$TRANSFORMED_USERS ;;
            -cluster) users=$CLUSTER_USERS ;;
            *) users=$USERS ;;
        esac
        rm -rf "$WORK/data$run" "$WORK/out$run"
        mkdir -p "$WORK/data$run" "$WORK/out$run"
        if [ "$run" = -dp ]; then  # the AOL slice's users share too few pairs for any to pass tau: MSNBC's categories do
            "$PYTHON" deploy/compose_release.py slice "$CELS_DATA/msnbc990928.seq.gz" --format msnbc --users "$DP_USERS" --parties 3 --out "$WORK/data$run"
        else
            "$PYTHON" deploy/compose_release.py slice "$CELS_DATA/aol-dev.tsv.gz" --users "$users" --parties 3 --out "$WORK/data$run"
        fi
        chown 1000:1000 "$WORK/out$run" 2>/dev/null || chmod 0777 "$WORK/out$run"  # the image's cels user writes there
    done
    cp deploy/session.toml "$WORK/session.toml"
    cp deploy/session.toml "$WORK/session-cluster.toml"
    sed 's/^solve = "private"/solve = "transformed"/' deploy/session.toml >"$WORK/session-transformed.toml"
    grep -q '^solve = "transformed"' "$WORK/session-transformed.toml" || { say "deploy/session.toml has no solve = \"private\" line"; exit 1; }
    # the DP histogram (docs/releases.md): delta 1e-6, its own output file
    sed -e 's/^delta = 0.4/delta = 1e-6\nrelease = "dp"\nmax_items_per_user = 1/' -e 's#^output = "/out/sanitized.tsv"#output = "/out/dp-histogram.tsv"#' \
        deploy/session.toml >"$WORK/session-dp.toml"
    grep -q '^release = "dp"' "$WORK/session-dp.toml" || { say "deploy/session.toml has no delta = 0.4 line"; exit 1; }
}

session() {  # session RUN [COMPOSE OPTIONS...]: "" (the private solve), -transformed or -cluster
    local run=$1 limit=${SESSION_SECONDS:-0}  # 0: no bound (timeout(1))
    shift
    export CELS_COMPOSE_WORK=$WORK CELS_COMPOSE_RUN=$run
    if [ -z "$run" ]; then
        "${COMPOSE[@]}" down --volumes --remove-orphans --timeout 10 >/dev/null 2>&1 || true  # a crashed earlier run
        "${COMPOSE[@]}" up --no-build --detach prometheus 2>&1 | tee "$WORK/logs/prometheus-up.log"
    fi
    local status
    set +e
    # `up run`: the trigger and what it depends on; the trigger's exit ends the run and is the
    # exit code (attaching to every service would end it when the certs step exits)
    timeout "$limit" "${COMPOSE[@]}" "$@" up --no-build --exit-code-from run run 2>&1 | tee "$WORK/logs/compose$run.log"
    status=${PIPESTATUS[0]}
    set -e
    "${COMPOSE[@]}" "$@" ps >&2
    if [ "$status" -eq 124 ]; then
        say "the session did not end within $limit s"
        exit 1
    elif [ "$status" -ne 0 ]; then
        say "docker-compose up exited $status"
        exit "$status"
    fi
}

audit() {  # audit RUN
    "$PYTHON" deploy/compose_release.py audit --input "$WORK/data$1/input.tsv" --out "$WORK/out$1" --session "$WORK/session$1.toml"
}

metrics() {
    "$PYTHON" deploy/compose_release.py metrics --api "$PROMETHEUS_API"
}

cluster() {  # party-1 on its own Ray cluster: the cluster profile's head and worker, then the session
    local on_ray=(--env-file deploy/cluster.env) workers
    export CELS_COMPOSE_WORK=$WORK CELS_COMPOSE_RUN=-cluster
    # the worker waits for the head's healthcheck (its Ray client server answers), and party-1
    # (recreated: its engine flags changed) joins the head only once both run
    "${COMPOSE[@]}" "${on_ray[@]}" up --no-build --detach ray-worker 2>&1 | tee "$WORK/logs/ray-up.log"
    SESSION_SECONDS=$CLUSTER_SECONDS session -cluster "${on_ray[@]}"
    # the head has no CPUs: party-1's tasks and user-shard actors ran in Ray workers on ray-worker
    workers=$("${COMPOSE[@]}" exec -T ray-worker sh -c 'ls /tmp/ray/session_latest/logs' | grep -c '^worker-.*\.out$' || true)
    if [ "$workers" -eq 0 ]; then
        say "no Ray worker process ran on ray-worker"
        exit 1
    fi
    say "ray-worker ran $workers Ray worker processes for party-1"
    # a stranger on the nodes' network: a fresh container of the image, with no token and no
    # certificate, tries Ray's client (as party-1 joins) and `ray start` (as the worker joined)
    local network verdict status stranger=(docker run --rm -i -e RAY_USAGE_STATS_ENABLED=0 -e RAY_gcs_rpc_server_reconnect_timeout_s=5)
    network=$(docker inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}} {{end}}' "$("${COMPOSE[@]}" ps -q ray-head)")
    network=${network%% *}  # its first (the cluster profile's services join one)
    stranger+=(--network "$network")
    [ "$NETWORKS" = own ] || stranger+=(--add-host ray-head:127.0.0.1)
    verdict=$("${stranger[@]}" cels:dev python3 - connect ray-head 7110 <deploy/compose_probe.py)  # it reaches the port: a refusal below is Ray's, not the network's
    say "a stranger on $network connecting to ray-head:7110: $verdict"
    [ "$verdict" = REACHED ] || exit 1
    verdict=$("${stranger[@]}" cels:dev timeout 180 python3 - ray ray://ray-head:7111 <deploy/compose_probe.py 2>/dev/null | tail -1)
    say "a stranger on $network calling ray://ray-head:7111: ${verdict:-no verdict}"
    [ "${verdict%% *}" = REFUSED ] || exit 1
    status=0
    "${stranger[@]}" cels:dev timeout 180 ray start --address=ray-head:7110 --disable-usage-stats >"$WORK/logs/stranger-ray-start.log" 2>&1 || status=$?
    say "a stranger on $network running ray start --address=ray-head:7110: exit $status ($(grep -v '^ *$' "$WORK/logs/stranger-ray-start.log" | tail -1 | cut -c1-160))"
    [ "$status" -ne 0 ] || exit 1
}

mkdir -p "$WORK/logs"
trap teardown EXIT
say "work directory $WORK"
step engine engine
step base base
step networking networking
step wheelhouse wheelhouse
step image image
step data data
step session session ""
step audit audit ""
step isolation isolation
step transformed session -transformed
step taudit audit -transformed
step dp session -dp
step dpaudit audit -dp
step metrics metrics
step cluster cluster
step caudit audit -cluster
