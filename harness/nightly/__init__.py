"""`mxchaos nightly`: every scenario that can be bound, N times each, as one night folder
(``junit.xml``, ``nightly.json``, ``index.html``) compared with the night before."""

from __future__ import annotations
