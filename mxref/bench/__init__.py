"""Benchmarks and the demo: a raw NIXL READ (``raw``), the load benchmark (``load``, ``report``,
``loopback``), the metadata server under a fleet (``fleet``), floods (``flood``, ``refusals``) and
``demo``. Each runs as ``python -m mxref.bench.NAME``."""
