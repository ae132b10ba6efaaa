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

    def dataset(self, name: str, spark: SparkResource | None = None) -> Dataset:
        """A dataset of the lake; with ``spark``, its Spark choices apply to the work."""
        settings = self.settings()
        if spark is not None:
            settings = spark.configure(settings)
        return Lakehouse(settings=settings).dataset(name)


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The run's Spark session, created on first use and shared by every step.

    With a Spark Connect URL (``remote`` or LAKEHOUSE_SPARK_REMOTE) every step
    talks to that warm server; otherwise the jobs run with the in-process
    executor, so all steps of a run live in one process and get the same
    session (one JVM start per run, not per step). Steps that find nothing to
    do never start it.
    """

    master: str | None = Field(
        default=None, description="Spark master URL (default: LAKEHOUSE_SPARK_MASTER or local[*])."
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL, sc://host:port (default: LAKEHOUSE_SPARK_REMOTE).",
    )

    def configure(self, settings: Settings) -> Settings:
        """``settings`` with this resource's Spark choices applied."""
        updates = {
            k: v for k, v in (("spark_master", self.master), ("spark_remote", self.remote)) if v
        }
        return settings.model_copy(update=updates) if updates else settings

    def session(self, settings: Settings) -> SparkSession:
        from lakehouse_assets.spark.session import get_spark

        return get_spark(self.configure(settings))
