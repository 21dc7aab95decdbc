"""Subjects: who plays the sources and readers of a scenario (``mxref``, the default, or the
real ``modelexpress`` client through its adapter), and the environment each runs in."""

from __future__ import annotations
