"""Resources: the lake a code location works on, its object storage and its Spark session.

- ``lakehouse`` (:class:`LakehouseResource`): the lake and journal, as the CLI
  sees them (``LAKEHOUSE_*``); for an ``s3://`` lake its nested ``s3`` resource
  (dagster-aws's :class:`~dagster_aws.s3.S3Resource`) carries the endpoint and
  credentials, wired with ``dg.EnvVar`` so the UI shows which variable each
  comes from and never its value;
- ``spark`` (:class:`SparkResource`): dagster-pyspark's ``PySparkResource``,
  made lazy (a step with nothing to do never starts a JVM) and aware of the
  Spark Connect remote.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import dagster as dg
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource
from pydantic import Field

from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: S3Resource field → the environment variable it is read from (dg.EnvVar).
S3_ENV = {
    "endpoint_url": "LAKEHOUSE_S3_ENDPOINT_URL",
    "aws_access_key_id": "LAKEHOUSE_S3_ACCESS_KEY_ID",
    "aws_secret_access_key": "LAKEHOUSE_S3_SECRET_ACCESS_KEY",
    "region_name": "LAKEHOUSE_S3_REGION",
}

#: S3Resource field → the lake setting it fills.
S3_SETTINGS = {
    "endpoint_url": "s3_endpoint_url",
    "aws_access_key_id": "s3_access_key_id",
    "aws_secret_access_key": "s3_secret_access_key",
    "region_name": "s3_region",
}


def s3_from_env(environ: dict[str, str] | None = None) -> S3Resource:
    """dagster-aws's S3 resource, each credential an ``dg.EnvVar`` of the variables set.

    A variable that is not set is left out rather than wired (Dagster refuses a
    run whose ``EnvVar`` is unset): boto3's own chain (instance role, profile)
    then applies, as it does for the CLI.
    """
    env = os.environ if environ is None else environ
    fields: dict[str, Any] = {
        field: dg.EnvVar(name) for field, name in S3_ENV.items() if env.get(name)
    }
    return S3Resource(**fields)


class LakehouseResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The lake (and journal) the assets read and write.

    Unset fields fall back to the ``LAKEHOUSE_*`` environment, exactly as the
    CLI does, so ``make ui`` and the CLI always look at the same lake. The
    ``s3`` resource's values, where set, override the environment's for an
    ``s3://`` lake.
    """

    lake_uri: str | None = Field(
        default=None,
        description="Local folder or s3://bucket/prefix (default: LAKEHOUSE_LAKE_URI).",
    )
    journal_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the journal (default: LAKEHOUSE_JOURNAL_URL)."
    )
    s3: S3Resource = Field(
        default_factory=S3Resource,
        description="Object storage of an s3:// lake (dagster-aws): endpoint, region, keys.",
    )

    def settings(self) -> Settings:
        updates: dict[str, Any] = {
            k: v for k, v in (("lake_uri", self.lake_uri), ("journal_url", self.journal_url)) if v
        }
        for field, setting in S3_SETTINGS.items():
            value = getattr(self.s3, field, None)
            if value:
                updates[setting] = value
        return Settings().model_copy(update=updates)

    def lake(self) -> Lakehouse:
        return Lakehouse(settings=self.settings())

    def dataset(self, name: str, spark: SparkResource | None = None) -> Dataset:
        """A dataset of the lake; with ``spark``, its Spark choices apply to the work."""
        settings = self.settings()
        if spark is not None:
            settings = spark.configure(settings)
        return Lakehouse(settings=settings).dataset(name)


class SparkResource(PySparkResource):
    """dagster-pyspark's Spark resource, started on first use and shared by every step.

    ``PySparkResource`` starts its session when a run sets the resource up; ours
    waits until a step asks (:meth:`session`), because most automation steps
    find nothing new and must not pay a JVM start. ``spark_config`` is applied
    to the session as PySparkResource does (to an in-process session at
    start; to a Connect session, its runtime settings). With a Spark Connect
    URL (``remote`` or LAKEHOUSE_SPARK_REMOTE) every step talks to that warm
    server; otherwise the jobs run with the in-process executor, so all steps
    of a run share one in-process session (one JVM start per run).
    """

    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark settings (e.g. spark.executor.memory) on top of the lake's.",
    )
    master: str | None = Field(
        default=None, description="Spark master URL (default: LAKEHOUSE_SPARK_MASTER or local[*])."
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL, sc://host:port (default: LAKEHOUSE_SPARK_REMOTE).",
    )

    @classmethod
    def _is_dagster_maintained(cls) -> bool:
        return False

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """Nothing: the session starts when a step first needs it."""

    @property
    def spark_session(self) -> SparkSession:
        """PySparkResource's accessor: the session for the environment's lake settings."""
        return self.session(Settings())

    def configure(self, settings: Settings) -> Settings:
        """``settings`` with this resource's Spark choices applied."""
        updates: dict[str, Any] = {
            k: v for k, v in (("spark_master", self.master), ("spark_remote", self.remote)) if v
        }
        if self.spark_config:
            updates["spark_config"] = {
                **settings.spark_config,
                **{k: str(v) for k, v in self.spark_config.items()},
            }
        return settings.model_copy(update=updates) if updates else settings

    def session(self, settings: Settings) -> SparkSession:
        from lakehouse_assets.spark.session import get_spark

        return get_spark(self.configure(settings))
