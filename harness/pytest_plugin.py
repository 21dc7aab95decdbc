"""pytest plugin (entry point ``pytest11``): collects scenario files as test items."""

from __future__ import annotations
