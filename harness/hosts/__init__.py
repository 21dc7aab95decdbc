"""Hosts: where a scenario's processes run, and everything that makes and finds those places.

- ``base``: the ``Host`` protocol every kind satisfies (spawn, exec, read, port probe, process
  scan, and what the run reads of a host: its address, whether its files are this machine's,
  its clock, how a network fault's command reaches it), and ``LocalHost``, this machine.
- ``netns``: ``NetnsHost``, a network namespace of the run on one bridge (``Network``), and the
  sweep of a crashed run's namespaces and veths.
- ``ssh``: ``SshHost``, a logical host bound to an inventory machine reached over one OpenSSH
  control master; ``ssh_remote``: the small programs it runs there and its long-lived remote
  shell; ``ssh_sweep``: ``mxchaos cleanup --inventory``; ``srun``: the command prefix and the
  failure rule of a machine reached through ``srun`` steps of its SLURM job instead (``reach: srun``).
- ``inventory``: the inventory file and the binding of logical hosts to its machines.
- ``lab``: ``mxchaos lab``, ssh hosts made of namespaces running sshd on this machine.

What it may import: the harness's leaves (errors, spec, procscan, runscope, statedir, ports,
ledger, capabilities) and the scenario's file-location helpers (an inventory error points at its
line); ``ssh``'s probe of what a scenario needs reads the scenario model and the fault registry,
and ``ssh_sweep`` the network faults' qdisc handle. Never the runner, the process table, the
nemesis, the checks, the verdict or the report (``tests/unit/harness/test_harness_structure.py``). The
faults import ``base`` (``Place``); this package imports none of its submodules.
"""
