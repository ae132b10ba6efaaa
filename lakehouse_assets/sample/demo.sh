#!/bin/sh
# The demo: ingest the sample dataset through the CLI on the embedded
# defaults (a lake folder in the checkout, SQLite journal, local Spark),
# then materialize the Dagster asset graph for it (flush into the Delta
# tables, checks, the four exports) and show what it made.
# Run by `make demo`.
set -eu
LAKE=${LAKE:-demo-lake}
VENV=${VENV:-.venv}
HERE=$(dirname "$0")
LH="$VENV/bin/lakehouse --lake $LAKE"
DS=sample_companies

echo "== lake: $LAKE (journal: $LAKE/journal.sqlite)"
# One warm Spark for every step: a local Spark Connect server (unless
# LAKEHOUSE_SPARK_REMOTE already names one, e.g. a cluster's), stopped at the end.
if [ -z "${LAKEHOUSE_SPARK_REMOTE:-}" ]; then
  PORT=${LAKEHOUSE_SPARK_CONNECT_PORT:-15002}
  if $LH spark status --port "$PORT" >/dev/null 2>&1; then
    echo "== using the Spark Connect server already running on 127.0.0.1:$PORT"
  else
    echo "== starting a local Spark Connect server on 127.0.0.1:$PORT (one warm JVM for every step; stopped when the demo ends)"
    $LH spark start --port "$PORT" | sed 's/^/  /'
    trap '$LH spark stop --port "$PORT" >/dev/null 2>&1 || true' EXIT
    trap 'exit 130' INT TERM
  fi
  export LAKEHOUSE_SPARK_REMOTE="sc://127.0.0.1:$PORT"
else
  echo "== Spark: $LAKEHOUSE_SPARK_REMOTE"
fi
$LH datasets create $DS --title "Sample companies, people and ownerships"
echo "== archiving source documents (each also becomes a Document entity)"
for f in "$HERE"/documents/*; do
  $LH -d $DS archive add --document "$f" >/dev/null
done
$LH -d $DS archive ls > "$LAKE/.archive-ls.jsonl"
"$VENV/bin/python" - "$LAKE/.archive-ls.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print("  {}…  {:>5} B  {:<22} {}".format(m["checksum"][:12], m["size"], m["mimetype"], m["name"]))
PY
rm -f "$LAKE/.archive-ls.jsonl"
echo "== writing entities"
$LH -d $DS entities write -i "$HERE/entities.ftm.json" --origin sample
echo "== mapping the archived shareholders CSV (followthemoney mapping, origin mapping:{sha256})"
CSV_SHA=$("$VENV/bin/python" -c 'import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],"rb").read()).hexdigest())' "$HERE/documents/northwind-shareholders.csv")
$LH -d $DS mapping add "$CSV_SHA" "$HERE/northwind-shareholders.yml"
$LH -d $DS mapping process "$CSV_SHA" --engine local
echo "== stored"
"$VENV/bin/python" - "$LAKE" "$DS" <<'PY'
import sys
from lakehouse_assets import Lakehouse
lake = Lakehouse(sys.argv[1])
ds = lake.dataset(sys.argv[2])
print(f"  datasets in lake: {', '.join(lake.datasets())}")
print(f"  archived files:   {len(list(ds.archive.list()))}")
print(f"  journal rows:     {lake.journal.count(ds.name)} statements waiting to be flushed")
for key, ts in ds.core_tags.items():
    print(f"  tag {key:<22} {ts.isoformat()}")
PY
echo "== materializing the asset graph through Dagster (instance: \$DAGSTER_HOME=${DAGSTER_HOME:-unset})"
echo "   flush -> statements + translog -> checks -> statements_csv, entities_ftm_json, statistics -> index"
LAKEHOUSE_LAKE_URI=$LAKE "$VENV/bin/python" -m lakehouse_assets.defs.demo $DS 2>"$LAKE/.dagster.log" || {
  echo "the Dagster run failed; its log:"; cat "$LAKE/.dagster.log"; exit 1; }
"$VENV/bin/python" - "$LAKE" "$DS" <<'PY'
import sys
from lakehouse_assets import Lakehouse
ds = Lakehouse(sys.argv[1]).dataset(sys.argv[2])
entity = ds.get_entity("acme-trading")
print(f"  get acme-trading: {entity.caption if entity else None} ({entity.schema.name if entity else '-'})")
PY
echo "== published versions (the chain head is the last line) and their verification"
$LH -d $DS versions
$LH -d $DS verify
echo "== graph index: who points at acme-holding (refs; the index is the graph asset)"
"$VENV/bin/python" - "$LAKE" "$DS" <<'PY'
import sys
from lakehouse_assets import Lakehouse
from lakehouse_assets.graph import refs
ds = Lakehouse(sys.argv[1]).dataset(sys.argv[2])
for e in refs(ds, "acme-holding", direction="both"):
    arrow = "<-" if e["direction"] == "in" else "->"
    print(f"  {arrow} {e['prop']:<6} {e['other_id']:<18} {e['other_schema'] or '-':<10} {e['other_caption'] or ''}")
PY
echo "== files under $LAKE/$DS (archive omitted):"
find "$LAKE/$DS" -type f -not -path "*/archive/*" | sort | sed 's/^/  /'
