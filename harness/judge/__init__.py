"""Judging a run: the verdict, the integrity oracle (content), environment-broken cells."""
