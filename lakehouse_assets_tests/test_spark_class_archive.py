"""The JVM's class archive of Spark (``lakehouse spark prepare``): built by a real
training run, checked by a real Spark start that must map it, then used."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from lakehouse_assets.settings import Settings
from lakehouse_assets.spark import cds
from lakehouse_assets_tests.conftest import PROFILE


def _installed_archive() -> Path | None:
    """The archive ``make java`` built before the tests (in the default cache),
    with its training log and record; None where there is none."""
    path = cds.archive_path(Settings())
    if path is None or not path.is_file():
        return None
    if not (path.with_suffix(".log").is_file() and path.with_suffix(".json").is_file()):
        return None
    return path


def test_a_class_archive_is_built_once_checked_and_used(tmp_path: Path) -> None:
    """Built by ``lakehouse spark prepare``, which says what it does as it goes:
    its three stages and the training run's own stages (it was silent for
    minutes).

    The build is a training run of about a minute (two on CI's machine) that
    ``make java`` has just done before the suite, into the default cache: in
    ``make test`` that archive is the one checked (its training log, a real
    Spark start that maps it, ``prepare`` finding it there); the build itself
    runs here in the thorough profile, or where the install left no archive."""
    installed = _installed_archive()
    settings = Settings(cache_dir=str(tmp_path / "cache"))
    assert cds.java_options(settings) == ""  # nothing built yet: Spark starts as ever
    exe = str(Path(sys.executable).parent / "lakehouse")
    env = {k: v for k, v in os.environ.items() if k != "LAKEHOUSE_SPARK_REMOTE"}
    env["LAKEHOUSE_CACHE_DIR"] = str(settings.cache_path)
    if installed is None or PROFILE == "thorough":
        # trains, then starts Spark with -Xshare:on on it
        made = subprocess.run(
            [exe, "spark", "prepare"], capture_output=True, text=True, env=env, timeout=1800
        )
        assert made.returncode == 0, made.stderr
        assert made.stdout.startswith("class archive built and checked: ")
        lines = made.stderr.splitlines()
        stages = [line for line in lines if "spark prepare: " in line]
        assert [
            s.split("spark prepare: ")[1][:4]
            for s in stages
            if " 1/3 " in s or " 2/3 " in s or " 3/3 " in s
        ] == ["1/3 ", "2/3 ", "3/3 "]
        assert any("training: flush training:" in line for line in lines)  # the child's stages
        assert any("training: export training:" in line for line in lines)
        # each line carries its time since the command started (progress, not a log)
        assert all(re.match(r"\s*[0-9]+\.[0-9]s spark prepare: ", line) for line in stages)
    else:
        # the install's training run: its log holds the child's stages
        training = installed.with_suffix(".log").read_text()
        assert "flush training:" in training and "export training:" in training
        target = settings.cache_path / "jvm" / installed.name
        target.parent.mkdir(parents=True)
        for suffix in (".jsa", ".json", ".log"):
            shutil.copyfile(installed.with_suffix(suffix), target.with_suffix(suffix))
        # a real Spark start must map it (what the build's stage 2/3 checks)
        assert cds.check(settings, target) is None
        made = subprocess.run(
            [exe, "spark", "prepare"], capture_output=True, text=True, env=env, timeout=600
        )
        assert made.returncode == 0, made.stderr
        assert made.stdout.startswith("class archive already there: ")
    done = cds.prepare(settings)
    assert not done.built and done.path.is_file() and done.size > 10_000_000
    assert done.path.parent == settings.cache_path / "jvm"
    assert not list(done.path.parent.glob("*.partial"))
    assert made.stdout.split(": ", 1)[1].startswith(str(done.path))
    assert cds.java_options(settings) == f"-XX:SharedArchiveFile={done.path}"
    off = settings.model_copy(update={"spark_class_archive": False})
    assert cds.java_options(off) == ""
    # what an in-process Spark and the local Connect server are started with
    from lakehouse_assets.spark.session import spark_conf

    assert (
        f"-XX:SharedArchiveFile={done.path}"
        in spark_conf(settings)["spark.driver.extraJavaOptions"]
    )
    # a file that is not an archive: the Spark start that must map it fails
    bad = tmp_path / "bad.jsa"
    bad.write_bytes(b"not a class archive" * 100)
    assert cds.check(settings, bad) is not None


def test_archives_of_gone_or_reinstalled_sparks_are_removed(tmp_path: Path) -> None:
    """Each archive is about 190 MB: those of a Spark install that is gone or
    was reinstalled go; another live install's (sharing the cache) stays."""
    folder = tmp_path / "jvm"
    folder.mkdir()
    live_jars = tmp_path / "venv" / "jars"
    live_jars.mkdir(parents=True)
    stat = live_jars.stat()

    def archive(name: str, jars: str) -> Path:
        (folder / f"{name}.jsa").write_bytes(b"x")
        (folder / f"{name}.log").write_text("training")
        (folder / f"{name}.json").write_text(
            json.dumps({"identity": ["4.3.0", "/usr/bin/java:1:2", jars]})
        )
        return folder / f"{name}.jsa"

    live = archive("spark-4.3.0-live", f"{live_jars}:{stat.st_size}:{stat.st_mtime_ns}")
    gone = archive("spark-4.3.0-gone", f"{tmp_path}/deleted/jars:4096:1")
    reinstalled = archive("spark-4.3.0-old", f"{live_jars}:{stat.st_size}:{stat.st_mtime_ns - 1}")
    cds._remove_outdated(folder)
    assert live.exists() and live.with_suffix(".json").exists()
    for path in (gone, reinstalled):
        assert not path.exists()
        assert not path.with_suffix(".json").exists()
        assert not path.with_suffix(".log").exists()
