"""Benchmark: mapping a big CSV, ours (Spark) against followthemoney's ``ftm map``.

Generates a deterministic donations-like CSV of N rows (default 1M; seeded,
so every run maps the same file), then in the same run:

1. ``ftm map`` (followthemoney's CLI, one process) on the file, output to
   a file: rows/s and entities/s;
2. the lakehouse: archive the CSV, store the mapping, ``process_mapping`` on
   Spark (rows mapped in the executors, statements written to the SQLite
   journal): rows/s and statements/s, Spark start included.

    python -m benchmarks.mapping --rows 1000000 [--engine spark|local]
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from lakehouse_assets import Lakehouse

MAPPING = {
    "queries": [
        {
            "csv_url": "donations.csv",
            "entities": {
                "party": {
                    "schema": "Organization",
                    "key": "Party",
                    "properties": {"name": {"column": "Party"}},
                },
                "donor": {
                    "schema": "LegalEntity",
                    "key": "Donor",
                    "properties": {
                        "name": {"column": "Donor"},
                        "country": {"column": "Country"},
                        "addressEntity": {"entity": "address"},
                    },
                },
                "address": {
                    "schema": "Address",
                    "key": ["Street", "City", "Country"],
                    "properties": {
                        "full": {"template": "{{Street}}, {{City}}"},
                        "city": {"column": "City"},
                        "street": {"column": "Street"},
                        "country": {"column": "Country"},
                    },
                },
                "donation": {
                    "schema": "Payment",
                    "key": ["Party", "Donor", "DonationDate", "DonationEUR"],
                    "properties": {
                        "payer": {"entity": "donor"},
                        "beneficiary": {"entity": "party"},
                        "date": {"column": "DonationDate", "format": "%Y-%m-%d"},
                        "amountEur": {"column": "DonationEUR"},
                    },
                },
            },
        }
    ]
}

PARTIES = ["CDU", "SPD", "FDP", "Grüne", "Linke", "CSU", "MLPD", "Freie Wähler"]
COUNTRIES = ["Deutschland", "Österreich", "Schweiz", "Frankreich", "Niederlande"]
STREETS = ["Hauptstraße", "Schillerstraße", "Bahnhofstraße", "Am Markt", "Lindenweg"]
CITIES = ["Berlin", "Köln", "München", "Hamburg", "Leipzig", "Karlsruhe", "Dortmund"]


def generate(path: Path, rows: int) -> Path:
    """A donations-like CSV (seeded: the same file for the same N)."""
    if path.exists():
        return path
    rng = random.Random(20261122)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["Party", "DonationEUR", "Donor", "Street", "City", "Country", "DonationDate"]
        )
        for _ in range(rows):
            donor = f"Donor {rng.randrange(rows // 5 + 1):07d}"
            writer.writerow(
                [
                    rng.choice(PARTIES),
                    f"{rng.randrange(100, 500_000)}.{rng.randrange(100):02d}",
                    donor,
                    f"{rng.choice(STREETS)} {rng.randrange(1, 200)}",
                    f"{rng.randrange(10000, 99999)} {rng.choice(CITIES)}",
                    rng.choice(COUNTRIES),
                    f"20{rng.randrange(10, 25)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
                ]
            )
    tmp.replace(path)
    return path


def run_ftm_map(csv_path: Path, work: Path) -> tuple[float, int]:
    config = {"bench": {"queries": [{**q, "csv_url": str(csv_path)} for q in MAPPING["queries"]]}}
    mapping = work / "ftm-mapping.yml"
    mapping.write_text(yaml.safe_dump(config))
    ftm = Path(sys.executable).parent / "ftm"
    out = work / "ftm-entities.json"
    start = time.perf_counter()
    with out.open("wb") as fh:
        subprocess.run(
            [str(ftm), "map", "-d", "bench", str(mapping)],
            check=True,
            stdout=fh,
            stderr=subprocess.DEVNULL,
        )
    elapsed = time.perf_counter() - start
    with out.open("rb") as fh:
        lines = sum(1 for _ in fh)
    out.unlink()
    return elapsed, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--engine", choices=["spark", "local"], default="spark")
    parser.add_argument("--skip-ftm", action="store_true", help="Do not run ftm map.")
    args = parser.parse_args()
    data_dir = Path(__file__).parent / ".data"
    data_dir.mkdir(exist_ok=True)
    csv_path = generate(data_dir / f"donations-{args.rows}.csv", args.rows)
    size_mb = csv_path.stat().st_size / 1e6
    print(f"csv: {args.rows:,} rows, {size_mb:.0f} MB ({csv_path})")
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-map-"))
    try:
        if not args.skip_ftm:
            seconds, entities = run_ftm_map(csv_path, work)
            print(
                f"ftm map:   {seconds:7.1f} s  {args.rows / seconds:9,.0f} rows/s  "
                f"{entities / seconds:9,.0f} entities/s ({entities:,} entity lines)"
            )
        lake = Lakehouse(work / "lake")
        ds = lake.create_dataset(f"bench_{os.getpid()}")
        meta = ds.add_file(str(csv_path))
        ds.add_mapping(meta.checksum, MAPPING)
        start = time.perf_counter()
        result = ds.process_mapping(meta.checksum, spark=args.engine == "spark")
        seconds = time.perf_counter() - start
        print(
            f"lakehouse: {seconds:7.1f} s  {result.csv_rows / seconds:9,.0f} rows/s  "
            f"{result.statements / seconds:9,.0f} statements/s "
            f"({result.statements:,} statements into the journal; engine {result.engine}, "
            "Spark start included)"
        )
        if result.map_seconds:
            journal = seconds - result.map_seconds
            print(
                f"  of which mapping on Spark (start, CSV split, executors): "
                f"{result.map_seconds:.1f} s = {result.csv_rows / result.map_seconds:,.0f} rows/s; "
                f"journal write: {journal:.1f} s = {result.statements / journal:,.0f} statements/s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
