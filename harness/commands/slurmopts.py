"""``--slurm`` and its options, shared by ``mxchaos nightly`` and ``mxchaos matrix`` (docs/slurm-dispatch.md)."""

from __future__ import annotations

import argparse
from typing import Any

from harness.hosts import slurm
from harness.hosts.slurm_dispatch import Options

__all__ = ["add_slurm_options", "slurm_options"]


def add_slurm_options(p: Any) -> None:
    """``--slurm`` and its options (``mxchaos nightly`` and ``mxchaos matrix``)."""
    g = p.add_argument_group("SLURM (docs/slurm-dispatch.md)")
    g.add_argument("--slurm", action="store_true",
                   help="run the lanes as one SLURM job array (sbatch --array), each on a node of its own; "
                        "the nodes must share this folder's file system")
    g.add_argument("--partition", metavar="P", help="sbatch --partition (default: SLURM's default partition)")
    g.add_argument("--time", metavar="T", help="sbatch --time of each lane (SLURM's format: MM, HH:MM:SS, D-HH)")
    g.add_argument("--allocation-timeout", type=float, default=600.0, metavar="S",
                   help="a lane still pending after S seconds is an infrastructure verdict (default 600)")


def slurm_options(args: argparse.Namespace, label: str) -> Any:
    """The dispatch options of ``--slurm``, after the controller answered (``SlurmUnavailable`` otherwise)."""
    conf = slurm.conf_path()
    slurm.ping(conf)
    return Options(conf, partition=args.partition, time_limit=args.time,
                   allocation_timeout=float(args.allocation_timeout), label=label)
