"""Spark: the session factory and the batch jobs that run on it."""
