"""mxchaos harness: scenario files -> real processes -> faults -> one timeline -> checks -> report."""

from __future__ import annotations
