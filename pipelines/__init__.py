"""Dagster wiring only: the code location, jobs, schedules and sensors."""
