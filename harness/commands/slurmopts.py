"""``--slurm`` and its options, shared by ``mxchaos nightly`` and ``mxchaos matrix`` (docs/slurm-dispatch.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness.counts import at_least
from harness.hosts import slurm
from harness.hosts.slurm_dispatch import Options

__all__ = ["add_slurm_options", "slurm_options"]


def add_slurm_options(p: Any) -> None:
    """``--slurm`` and its options (``mxchaos nightly`` and ``mxchaos matrix``)."""
    g = p.add_argument_group("SLURM (docs/slurm-dispatch.md)")
    g.add_argument("--slurm", action="store_true",
                   help="run the lanes as one SLURM job array (sbatch --array), each on a node of its own; "
                        "the nodes must share this folder's file system, unless --node-local")
    g.add_argument("--partition", metavar="P", help="sbatch --partition (default: SLURM's default partition)")
    g.add_argument("--time", metavar="T", help="sbatch --time of each lane (SLURM's format: MM, HH:MM:SS, D-HH)")
    g.add_argument("--nodes-per-lane", type=at_least(1, "a number of nodes per lane"), default=1, metavar="N",
                   help="give each lane N nodes (sbatch --nodes=N): its run binds the scenarios' hosts to them "
                        "(--inventory slurm: inside the task, over ssh); default 1 (a lane's hosts are network "
                        "namespaces on its one node)")
    g.add_argument("--lane-inventory", metavar="FILE",
                   help="with --nodes-per-lane over 1: an inventory file with slurm: saying how a lane reaches its "
                        "nodes (user, identity_file, python, repo; `mxchaos lab up --slurm` writes one); default slurm:")
    g.add_argument("--reach", choices=("ssh", "srun"), default="ssh",
                   help="with --nodes-per-lane over 1: how a lane's run reaches its nodes: ssh (--inventory slurm: "
                        "or the --lane-inventory file) or srun steps of the lane's own job (--inventory "
                        "slurm+srun:[FILE], every node through srun whatever the file says), where the site refuses "
                        "ssh into its nodes; default ssh")
    g.add_argument("--node-local", metavar="DIR", type=_node_dir,
                   help="the nodes do not see this folder: each lane writes under DIR on its node ({node}/ of it) "
                        "and the dispatcher takes its folder back through srun (docs/slurm-dispatch.md)")
    g.add_argument("--allocation-timeout", type=float, default=600.0, metavar="S",
                   help="a lane still pending after S seconds is an infrastructure verdict (default 600)")


def slurm_options(args: argparse.Namespace, label: str) -> Any:
    """The dispatch options of ``--slurm``, after the controller answered (``SlurmUnavailable`` otherwise)."""
    reach = getattr(args, "reach", "ssh")
    if reach != "ssh" and int(getattr(args, "nodes_per_lane", 1)) <= 1:
        print(f"--reach {reach}: how the lanes of --nodes-per-lane over 1 reach their nodes (a lane of one node "
              "runs its hosts there, reaching nothing)", file=sys.stderr)
        raise SystemExit(2)
    conf = slurm.conf_path()
    slurm.ping(conf)
    inventory = str(Path(args.lane_inventory).resolve()) if getattr(args, "lane_inventory", None) else None
    return Options(conf, partition=args.partition, time_limit=args.time,
                   allocation_timeout=float(args.allocation_timeout), label=label,
                   nodes_per_lane=int(getattr(args, "nodes_per_lane", 1)), lane_inventory=inventory,
                   reach=reach, node_local=getattr(args, "node_local", None))


def _node_dir(text: str) -> str:
    """``--node-local``: an absolute path (a folder on the nodes, not here: never resolved here)."""
    if not text.startswith("/") or any(c in text for c in "\n\0'\"$`\\{}") or "/../" in f"{text}/":
        raise argparse.ArgumentTypeError(f"{text!r}: an absolute path on the nodes, without quotes, $, `, braces or ..")
    return text

