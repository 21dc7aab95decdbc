"""``mxchaos soak``: transfers to death. Long-lived mxref processes (a metadata server, sources,
readers that load again on request) move load after load over real NIXL while the harness samples
every process's descriptors, memory, threads, TCP sockets and NIXL audit, and judges each
resource's slope per 1,000 transfers with its interval: flat, or a growth named with its rate.

``fleet`` (the processes), ``probe`` (what is sampled), ``record`` (``samples.jsonl``, resumable),
``slope`` (the fit and the judgement), ``verdict`` (the summary), ``page`` (``soak.html``),
``runner`` (the loop). The command is ``harness.commands.soak``.
"""
