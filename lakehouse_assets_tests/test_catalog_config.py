"""The catalog ``config.yml``: argument > environment > config.yml > default, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import CatalogConfig
from lakehouse_assets.cli import cli
from lakehouse_assets.errors import InvalidConfigError
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import make_bucket


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LAKEHOUSE_* variable and no ./lakehouse.env unless a test sets one."""
    for name in ("LAKEHOUSE_JOURNAL_URL", "LAKEHOUSE_VACUUM_RETENTION_HOURS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def write_config(lake_dir: Path, config: dict[str, object] | str) -> None:
    lake_dir.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    (lake_dir / cv.CATALOG_CONFIG).write_text(text)


def test_without_config_the_built_in_defaults_apply(tmp_path: Path) -> None:
    lake = Lakehouse(tmp_path / "lake")
    assert lake.catalog_config is None
    assert lake.setting_sources == {"journal_url": "default", "vacuum_retention_hours": "default"}
    assert lake.settings.vacuum_retention_hours == 168
    assert lake.settings.resolved_journal_url().endswith("lake/journal.sqlite")
    lake.create_dataset("first")  # the catalog gets its config.yml, which reads back
    assert Lakehouse(tmp_path / "lake").catalog_config == CatalogConfig()


def test_precedence_argument_environment_config_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake_dir = tmp_path / "lake"
    from_config = f"sqlite:///{tmp_path / 'config.sqlite'}"
    from_env = f"sqlite:///{tmp_path / 'env.sqlite'}"
    from_arg = f"sqlite:///{tmp_path / 'arg.sqlite'}"
    write_config(
        lake_dir, {"journal_url": from_config, "retention": {"vacuum_retention_hours": 12}}
    )

    lake = Lakehouse(lake_dir)
    assert lake.settings.journal_url == from_config
    assert lake.settings.vacuum_retention_hours == 12
    assert lake.setting_sources == {
        "journal_url": "config.yml",
        "vacuum_retention_hours": "config.yml",
    }
    # the config's journal is the one written to
    lake.create_dataset("ds").add_entity({"id": "p1", "schema": "Person", "properties": {}})
    assert (tmp_path / "config.sqlite").exists() and lake.journal.count("ds") == 1
    assert not (lake_dir / "journal.sqlite").exists()

    monkeypatch.setenv("LAKEHOUSE_JOURNAL_URL", from_env)
    monkeypatch.setenv("LAKEHOUSE_VACUUM_RETENTION_HOURS", "48")
    lake = Lakehouse(lake_dir)
    assert (lake.settings.journal_url, lake.settings.vacuum_retention_hours) == (from_env, 48)
    assert set(lake.setting_sources.values()) == {"environment"}

    lake = Lakehouse(lake_dir, journal_url=from_arg)
    assert lake.settings.journal_url == from_arg
    assert lake.setting_sources["journal_url"] == "argument"
    assert lake.settings.vacuum_retention_hours == 48


def test_dataset_defaults_fill_what_the_creator_does_not_give(tmp_path: Path) -> None:
    lake_dir = tmp_path / "lake"
    write_config(
        lake_dir,
        {
            "title": "Investigations",
            "dataset_defaults": {
                "publisher": {"name": "ACME Research", "url": "https://acme.example.org"},
                "license": "https://creativecommons.org/licenses/by/4.0/",
                "summary": "Collected by ACME.",
            },
        },
    )
    lake = Lakehouse(lake_dir)
    ds = lake.create_dataset("leaks", title="Leaks", summary="Our own summary.")
    config = ds.config()
    assert config.publisher is not None and config.publisher.name == "ACME Research"
    assert config.license == "https://creativecommons.org/licenses/by/4.0/"
    assert config.summary == "Our own summary." and config.title == "Leaks"
    # an existing dataset is not rewritten from the defaults
    raw = yaml.safe_load((lake_dir / "leaks" / "config.yml").read_text())
    del raw["license"]
    (lake_dir / "leaks" / "config.yml").write_text(yaml.safe_dump(raw))
    assert lake.create_dataset("leaks").config().license is None
    # and write_catalog keeps the operator's config.yml as it is
    assert yaml.safe_load((lake_dir / cv.CATALOG_CONFIG).read_text())["title"] == "Investigations"


@pytest.mark.parametrize(
    ("text", "messages"),
    [
        ("retention: [unclosed\n", ["not valid YAML at line 2", "config.yml"]),
        ("journal_url: sqlite:///x\njournal_ur: typo\n", ["journal_ur: unknown key"]),
        (
            "retention:\n  vacuum_retention_hours: soon\n",
            ["retention.vacuum_retention_hours", "valid integer", "'soon'"],
        ),
        ("retention:\n  vacuum_retention_hours: -1\n", ["greater than or equal to 0"]),
        ("dataset_defaults:\n  colour: red\n", ["unknown dataset field(s) colour", "publisher"]),
        ("dataset_defaults:\n  license: not a url\n", ["license"]),
        ("- a\n- list\n", ["expected a mapping of settings, got list"]),
    ],
)
def test_an_invalid_config_is_a_clear_error(tmp_path: Path, text: str, messages: list[str]) -> None:
    lake_dir = tmp_path / "lake"
    write_config(lake_dir, text)
    with pytest.raises(InvalidConfigError) as error:
        Lakehouse(lake_dir)
    message = str(error.value)
    assert message.startswith(str(lake_dir / cv.CATALOG_CONFIG))
    for part in messages:
        assert part in message
    # the CLI: one line, exit 1, no traceback
    res = CliRunner().invoke(cli, ["--lake", str(lake_dir), "config", "show"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1
    assert "config.yml" in res.stderr and "Traceback" not in res.stderr


def test_config_show_says_where_each_value_comes_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake_dir = tmp_path / "lake"
    write_config(
        lake_dir,
        {
            "journal_url": "postgresql://lake:secret@db.internal/journal",
            "retention": {"vacuum_retention_hours": 24},
        },
    )
    res = CliRunner().invoke(cli, ["--lake", str(lake_dir), "config", "show"])
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)  # not a terminal: JSON
    assert shown["exists"] is True and shown["path"] == str(lake_dir / cv.CATALOG_CONFIG)
    assert shown["effective"]["vacuum_retention_hours"] == {"value": 24, "source": "config.yml"}
    journal = shown["effective"]["journal_url"]
    assert journal["source"] == "config.yml" and "secret" not in res.stdout
    assert journal["value"] == "postgresql://lake:***@db.internal/journal"
    # --journal-url (or LAKEHOUSE_JOURNAL_URL, which it reads) wins over the file
    url = f"sqlite:///{tmp_path / 'j.sqlite'}"
    res = CliRunner().invoke(
        cli, ["--lake", str(lake_dir), "--journal-url", url, "config", "show", "--json"]
    )
    shown = json.loads(res.stdout)
    assert shown["effective"]["journal_url"] == {"value": url, "source": "argument"}


@pytest.mark.s3
def test_config_on_an_s3_lake(s3_settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bucket = make_bucket(s3_settings)
    uri = f"s3://{bucket}/lake"
    journal = f"sqlite:///{tmp_path / 'from-config.sqlite'}"
    first = Lakehouse(uri, settings=s3_settings)
    first.store.write_text(
        cv.CATALOG_CONFIG,
        yaml.safe_dump({"journal_url": journal, "dataset_defaults": {"category": "leak"}}),
    )
    lake = Lakehouse(uri, settings=s3_settings)
    assert lake.settings.resolved_journal_url() == journal
    assert lake.create_dataset("remote").config().category == "leak"
    first.store.write_text(cv.CATALOG_CONFIG, "journal_url: [")
    with pytest.raises(InvalidConfigError, match=f"s3://{bucket}/lake/config.yml: not valid YAML"):
        Lakehouse(uri, settings=s3_settings)
