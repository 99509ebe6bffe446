"""Dagster ConfigurableResources: thin typed handles on the library's stores, registry and compute."""
