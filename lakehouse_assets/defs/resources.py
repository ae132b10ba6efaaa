"""Resources: the lake a code location works on, and its Spark session."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The lake (and journal) the assets read and write.

    Unset fields fall back to the ``LAKEHOUSE_*`` environment, exactly as the
    CLI does, so ``make ui`` and the CLI always look at the same lake.
    """

    lake_uri: str | None = Field(
        default=None,
        description="Local folder or s3://bucket/prefix (default: LAKEHOUSE_LAKE_URI).",
    )
    journal_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the journal (default: LAKEHOUSE_JOURNAL_URL)."
    )

    def settings(self) -> Settings:
        updates = {
            k: v for k, v in (("lake_uri", self.lake_uri), ("journal_url", self.journal_url)) if v
        }
        return Settings().model_copy(update=updates)

    def lake(self) -> Lakehouse:
        return Lakehouse(settings=self.settings())

    def dataset(self, name: str) -> Dataset:
        return self.lake().dataset(name)


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The run's Spark session, created on first use and shared by every step.

    The jobs run with the in-process executor, so all steps of a run live in
    one process and get the same session (one JVM start per run, not per step).
    """

    master: str | None = Field(
        default=None, description="Spark master URL (default: LAKEHOUSE_SPARK_MASTER or local[*])."
    )

    def session(self, settings: Settings) -> SparkSession:
        from lakehouse_assets.spark.session import get_spark

        if self.master:
            settings = settings.model_copy(update={"spark_master": self.master})
        return get_spark(settings)
