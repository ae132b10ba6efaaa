#!/bin/sh
# The demo: ingest the sample dataset through the CLI on the embedded
# defaults (a lake folder in the checkout, SQLite journal, local Spark),
# flush it into the Delta tables, write the four exports and show them.
# Run by `make demo`.
set -eu
LAKE=${LAKE:-demo-lake}
VENV=${VENV:-.venv}
HERE=$(dirname "$0")
LH="$VENV/bin/lakehouse --lake $LAKE"
DS=sample_companies

echo "== lake: $LAKE (journal: $LAKE/journal.sqlite)"
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
echo "== flush + exports (local Spark; the first start takes a few seconds)"
$LH -d $DS make > "$LAKE/.make.json"
"$VENV/bin/python" - "$LAKE" "$DS" "$LAKE/.make.json" <<'PY'
import json, sys
from pathlib import Path
from lakehouse_assets import Lakehouse
lake_dir, name, report = sys.argv[1:4]
result = json.loads(Path(report).read_text())
flushed = result["flushed"] or {}
print(f"  flushed: {flushed.get('new', 0)} new statements, "
      f"{flushed.get('duplicates', 0)} duplicates, {flushed.get('tombstones', 0)} tombstones")
for kind, info in result["written"].items():
    path = Path(lake_dir).resolve() / name / info["path"]
    rows = f"{info['rows']:>4} rows  " if "rows" in info else " " * 11
    print(f"  {kind:<10} {rows}{path}")
if result["skipped"]:
    print(f"  fresh, not rewritten: {', '.join(result['skipped'])}")
ds = Lakehouse(lake_dir).dataset(name)
entity = ds.get_entity("acme-trading")
print(f"  get acme-trading: {entity.caption if entity else None} ({entity.schema.name if entity else '-'})")
PY
rm -f "$LAKE/.make.json"
echo "== files under $LAKE/$DS (archive omitted):"
find "$LAKE/$DS" -type f -not -path "*/archive/*" | sort | sed 's/^/  /'
