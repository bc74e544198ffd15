#!/usr/bin/env bash
# The user's path, from the wheel: build it, install it with no extras into a fresh
# venv, run a local cluster from that venv, produce and consume 1,000 messages, stop it
# with SIGINT; then install the [audit] extra and audit the cluster's data dir.
# One line per step; every wait is bounded. Usage: .ci/wheel_smoke.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-python3}
WORK=$(mktemp -d /tmp/mqmeta-wheel-smoke.XXXXXX)
DATA="$WORK/data"
LOCAL_PID=""
READY_TIMEOUT_S=90
STOP_TIMEOUT_S=30
AUDIT_TIMEOUT_S=600 # Spark on a loaded two-core machine
COUNT=1000

step() { echo "wheel smoke: $*"; }
fail() {
    echo "wheel smoke: FAILED: $*" >&2
    [ -f "$WORK/local-up.out" ] && tail -n 20 "$WORK/local-up.out" >&2
    exit 1
}
cleanup() {
    if [ -n "$LOCAL_PID" ] && kill -0 "$LOCAL_PID" 2>/dev/null; then
        kill -INT "$LOCAL_PID" 2>/dev/null || true
        for _ in $(seq 1 "$STOP_TIMEOUT_S"); do kill -0 "$LOCAL_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL "$LOCAL_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 143' TERM # a stopped smoke still stops its cluster (cleanup)

# From a copy of the tree (the files git tracks or would, as they are now): setuptools
# writes build/ and mqmeta.egg-info/ where it builds, and .ci/run installs the project
# editable in the tree while this smoke runs beside it.
step "build the wheel (pip wheel --no-deps) from a copy of the tree"
"$PYTHON" - "$WORK/src" <<'COPY' || fail "copy the tree"
import shutil, subprocess, sys
from pathlib import Path

listed = subprocess.run(
    ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], check=True, capture_output=True
).stdout
for name in filter(None, listed.decode().split("\0")):
    if Path(name).is_file():  # not a file deleted since the last commit
        target = Path(sys.argv[1]) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(name, target)
COPY
"$PYTHON" -m pip wheel --quiet --no-deps -w "$WORK/wheel" "$WORK/src" >"$WORK/build.out" 2>&1 || {
    cat "$WORK/build.out" >&2
    fail "pip wheel"
}
WHEEL=$(ls "$WORK"/wheel/mqmeta-*.whl)

step "install $(basename "$WHEEL") with no extras into a fresh venv"
"$PYTHON" -m venv "$WORK/venv"
VENV="$WORK/venv/bin"
"$VENV/python" -m pip install --quiet "$WHEEL" >"$WORK/install.out" 2>&1 || {
    cat "$WORK/install.out" >&2
    fail "pip install the wheel"
}
MQMETA="$VENV/mqmeta"
cd "$WORK" # imports must come from the venv, never from the repository's folders

step "one import package: 'import controller' fails, 'import mqmeta.controller' works"
if "$VENV/python" -c "import controller" 2>/dev/null; then fail "'import controller' worked"; fi
"$VENV/python" -c "import mqmeta.controller, mqmeta.broker_agent, mqmeta.replicator, mqmeta.cluster" ||
    fail "import mqmeta.controller"
version=$("$MQMETA" --version)
[ "$version" = "mqmeta $("$VENV/python" -c 'import mqmeta; print(mqmeta.__version__)')" ] ||
    fail "mqmeta --version said '$version'"
"$MQMETA" --help >/dev/null || fail "mqmeta --help"

step "without [audit], the audit is one sentence and exit 2"
set +e
"$MQMETA" audit "$DATA" --report "$WORK/report" 2>"$WORK/audit-missing.err"
status=$?
set -e
[ "$status" = 2 ] && grep -q "pip install 'mqmeta\[audit\]'" "$WORK/audit-missing.err" ||
    fail "audit without the extra: exit $status, $(cat "$WORK/audit-missing.err")"

step "start mqmeta local up --data-dir DIR (waiting up to ${READY_TIMEOUT_S} s for cluster.json)"
"$MQMETA" local up --data-dir "$DATA" >"$WORK/local-up.out" 2>&1 &
LOCAL_PID=$!
for _ in $(seq 1 $((READY_TIMEOUT_S * 5))); do
    [ -f "$DATA/cluster.json" ] && break
    kill -0 "$LOCAL_PID" 2>/dev/null || fail "local up exited"
    sleep 0.2
done
[ -f "$DATA/cluster.json" ] || fail "no cluster.json after ${READY_TIMEOUT_S} s"
grep -q "^export MQMETA_CONTROLLERS=" "$WORK/local-up.out" || fail "local up printed no export line"

step "the console (cluster.json's \"console\") serves its page and the vendored uPlot from the wheel"
CONSOLE=$("$VENV/python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["console"])' "$DATA/cluster.json") ||
    fail "cluster.json names no console"
"$VENV/python" - "$CONSOLE" <<'PY' || fail "the console at $CONSOLE"
import sys, urllib.request
base = sys.argv[1]
page = urllib.request.urlopen(base, timeout=10).read().decode()
assert "console.js" in page, page[:200]
for path in ("static/console.js", "static/vendor/uPlot.iife.min.js", "static/vendor/uPlot.LICENSE.txt"):
    assert urllib.request.urlopen(base + path, timeout=10).status == 200, path
PY

step "create a topic, produce and consume $COUNT messages (--cluster-dir)"
"$MQMETA" admin --cluster-dir "$DATA" topic create Smoke --queues 4 --json >/dev/null ||
    fail "topic create"
produced=$(timeout 120 "$MQMETA" produce --cluster-dir "$DATA" --topic Smoke --count "$COUNT" --json) ||
    fail "produce: $produced"
acked=$("$VENV/python" -c 'import json, sys; print(json.loads(sys.argv[1])["acked"])' "$produced")
[ "$acked" = "$COUNT" ] || fail "produce acknowledged $acked of $COUNT: $produced"
consumed=$(timeout 120 "$MQMETA" consume --cluster-dir "$DATA" --topic Smoke --group smoke \
    --until-idle 3 --json) || fail "consume: $consumed"
received=$("$VENV/python" -c 'import json, sys; print(json.loads(sys.argv[1])["received"])' "$consumed")
[ "$received" = "$COUNT" ] || fail "consume received $received of $COUNT: $consumed"
step "produced $acked, consumed $received"

step "stop local up with SIGINT (waiting up to ${STOP_TIMEOUT_S} s)"
kill -INT "$LOCAL_PID"
for _ in $(seq 1 $((STOP_TIMEOUT_S * 5))); do
    kill -0 "$LOCAL_PID" 2>/dev/null || break
    sleep 0.2
done
if kill -0 "$LOCAL_PID" 2>/dev/null; then fail "local up still runs ${STOP_TIMEOUT_S} s after SIGINT"; fi
set +e
wait "$LOCAL_PID"
status=$?
set -e
LOCAL_PID=""
[ "$status" = 0 ] || fail "local up exited $status after SIGINT"

step "install the wheel with [audit] and audit DIR"
"$VENV/python" -m pip install --quiet "$WHEEL[audit]" >"$WORK/install-audit.out" 2>&1 || {
    cat "$WORK/install-audit.out" >&2
    fail "pip install the wheel with [audit]"
}
started=$SECONDS
set +e
timeout "$AUDIT_TIMEOUT_S" "$MQMETA" audit "$DATA" --report "$WORK/report" >"$WORK/audit.out" 2>&1
status=$?
set -e
if [ "$status" != 0 ]; then
    tail -n 30 "$WORK/audit.out" >&2
    fail "mqmeta audit exited $status after $((SECONDS - started)) s (124: past ${AUDIT_TIMEOUT_S} s)"
fi
[ -f "$WORK/report/report.json" ] || fail "the audit wrote no report.json"
step "audit passed in $((SECONDS - started)) s; passed"
