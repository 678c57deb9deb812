#!/bin/sh
# The test suite's optional HBase-in-a-container path (tests/conftest.py, _start_container),
# for real: testcontainers against podman's Docker-compatible API, with the HBase image built
# from docker/hbase/Dockerfile (on the local debootstrap base image when it is missing).
#
#   sh tests/deploy/testcontainers_run.sh PYTHON [PYTEST ARGS...]      (make testcontainers-check)
#
# Runs a podman API service on a private socket for the session (stopped at the end); the
# Ryuk reaper is disabled (its image cannot be pulled here; the fixture stops its container
# itself).  This sandbox has /.dockerenv although podman runs beside the tests, so
# testcontainers is told the engine's published ports are on this machine
# (TESTCONTAINERS_CONNECTION_MODE=docker_host).  Fails unless the session's HBase really
# came from a container.
set -eu
PYTHON=${1:?usage: testcontainers_run.sh PYTHON [PYTEST ARGS...]}
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export CONTAINERS_CONF="$ROOT/docker/local/containers.conf"
IMAGE=${PERCOLATOR_TEST_HBASE_IMAGE:-localhost/percolator-hbase:2.6.1}
BASE_IMAGE=${BASE_IMAGE:-localhost/bookworm-min:latest}
start=$(date +%s)

if ! podman image exists "$IMAGE"; then
    [ "$BASE_IMAGE" = localhost/bookworm-min:latest ] && sh docker/local/make-base-image.sh
    podman build --network host --build-arg BASE_IMAGE="$BASE_IMAGE" \
        -f docker/hbase/Dockerfile -t "$IMAGE" .
fi
"$PYTHON" -c 'import testcontainers' 2>/dev/null \
    || "$PYTHON" -m pip install --quiet 'testcontainers>=4.0'

SOCKET=/tmp/percolator-podman-$$.sock
podman system service --time=0 "unix://$SOCKET" &
SERVICE=$!
LOG=$(mktemp /tmp/percolator-testcontainers.XXXXXX)
trap 'kill $SERVICE 2>/dev/null; wait $SERVICE 2>/dev/null; rm -f "$SOCKET" "$LOG"' EXIT INT TERM
i=0
while [ ! -S "$SOCKET" ]; do
    i=$((i + 1)); [ $i -gt 100 ] && { echo "podman system service did not start" >&2; exit 1; }
    sleep 0.1
done

if [ $# -eq 0 ]; then
    # The store backends' contract and the transaction protocol on HBase.
    set -- tests/store tests/txn -m hbase -q
fi
{
    env -u PERCOLATOR_TEST_HBASE_URL \
        DOCKER_HOST="unix://$SOCKET" TESTCONTAINERS_RYUK_DISABLED=true \
        TESTCONTAINERS_CONNECTION_MODE=docker_host \
        PERCOLATOR_TEST_HBASE=docker PERCOLATOR_TEST_HBASE_IMAGE="$IMAGE" \
        "$PYTHON" -m pytest -p no:cacheprovider "$@" && echo 0 > "$LOG.rc" || echo $? > "$LOG.rc"
} 2>&1 | tee "$LOG"
status=$(cat "$LOG.rc")
rm -f "$LOG.rc"
if ! grep -q "HBase in a container of" "$LOG"; then
    echo "testcontainers-check: the session's HBase did not come from a container" >&2
    exit 1
fi
[ "$status" -eq 0 ] || exit "$status"
echo "testcontainers-check: passed in $(( $(date +%s) - start )) s (image $IMAGE)"
