"""The record: what a run leaves behind, as values (timeline, fault windows, rates, cells, versions, machine load)."""
