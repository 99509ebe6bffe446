"""The weekly partitions of the pool; end_offset=1 makes the current, still-filling week selectable; weeks start on Monday."""

import dagster as dg

weekly = dg.WeeklyPartitionsDefinition(start_date="2026-01-05", end_offset=1, day_offset=1)
