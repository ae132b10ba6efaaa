#!/bin/sh
# The Dagster UI and daemon on 127.0.0.1 for the demo lake, with a warm local
# Spark Connect server that every run uses (unless LAKEHOUSE_SPARK_REMOTE
# already names one). Ctrl-C or SIGTERM stops the UI, the daemon, their code
# servers and the Spark server this script started. Run by `make ui`.
set -eu
LAKE=${LAKE:-demo-lake}
VENV=${VENV:-.venv}
UI_PORT=${UI_PORT:-3000}
# the webserver's and daemon's own lines on this terminal: warnings and errors
# (their INFO lines came every few seconds; sensor ticks and runs are in the UI);
# UI_LOG_LEVEL=info brings them back
UI_LOG_LEVEL=${UI_LOG_LEVEL:-warning}
LH="$VENV/bin/lakehouse --lake $LAKE"
export LAKEHOUSE_LAKE_URI="$LAKE"
started=""
if [ -z "${LAKEHOUSE_SPARK_REMOTE:-}" ]; then
  PORT=${LAKEHOUSE_SPARK_CONNECT_PORT:-15002}
  if ! $LH spark status --port "$PORT" >/dev/null 2>&1; then
    echo "== starting a local Spark Connect server on 127.0.0.1:$PORT (stopped with the UI)"
    $LH spark start --port "$PORT" | sed 's/^/  /'
    started=1
  else
    echo "== using the Spark Connect server already running on 127.0.0.1:$PORT"
  fi
  export LAKEHOUSE_SPARK_REMOTE="sc://127.0.0.1:$PORT"
fi
echo "== Spark for every run: $LAKEHOUSE_SPARK_REMOTE"
echo "== Dagster UI on http://127.0.0.1:$UI_PORT (lake $LAKE, instance $DAGSTER_HOME); it answers in a minute or so"
echo "   (this terminal shows warnings and errors only: sensor ticks and runs are in the UI; Ctrl-C stops it all)"
# dg dev in its own session (process group), so one signal reaches it and all
# its children: webserver, daemon, code servers, run workers
setsid "$VENV/bin/dg" dev -w workspace.yaml -h 127.0.0.1 -p "$UI_PORT" \
  --log-level "$UI_LOG_LEVEL" --code-server-log-level "$UI_LOG_LEVEL" &
UI=$!
cleanup() {
  trap - EXIT INT TERM
  kill -TERM "-$UI" 2>/dev/null || true
  i=0
  while kill -0 "-$UI" 2>/dev/null && [ $i -lt 60 ]; do sleep 0.5; i=$((i + 1)); done
  kill -KILL "-$UI" 2>/dev/null || true
  if [ -n "$started" ]; then $LH spark stop --port "$PORT" | sed 's/^/  /'; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
wait $UI
