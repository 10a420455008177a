"""The ``pskv`` console command.

Subcommands:
    pskv info        versions, optional backends (PyTorch, CUDA) and resolved settings
    pskv scheduler   run the scheduler role (cluster contract from the DMLC_* environment)
    pskv server      run a server role (same)
    pskv launch      start a job (scheduler, servers, workers) and supervise it (docs/launch.md)
    pskv keygen      write a CURVE cluster key file for authenticated, encrypted jobs (docs/security.md)
    pskv top         a running job's nodes, live: rounds/s, bytes/s, queues, stalls (docs/observability.md)
    pskv checkpoint  list the checkpoints (server or training) of a directory, or verify one (docs/distributed.md)
    pskv timeline    a job's timeline files (PSKV_TIMELINE) summed up per process, merged into one (docs/observability.md)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from pskv import __version__
from pskv.checkpoints import (
    TRAINING_META,
    Kind,
    is_checkpoint_name,
    kind_of,
    latest_server_checkpoint,
    latest_training_checkpoint,
    read_manifest,
)
from pskv.compression.residuals import read_store_file
from pskv.config import ENV_VARS, ClusterConfig, Config
from pskv.errors import CheckpointError, InvalidArgumentError, KVStoreError, OptimizerStateError, TransportError
from pskv.kvstore import known_types
from pskv.launch import DESCRIPTION as LAUNCH_DESCRIPTION
from pskv.launch import add_arguments as add_launch_arguments
from pskv.launch import run_args as run_launch
from pskv.optimizer import states as optimizer_states
from pskv.roles import run_role
from pskv.safefile import read_json
from pskv.server.snapshot import read_shard
from pskv.timeline import is_merged, write_merged
from pskv.timeline import load as load_timeline
from pskv.timeline import stragglers as timeline_stragglers
from pskv.timeline import summary as timeline_summary
from pskv.top import add_arguments as add_top_arguments
from pskv.top import run as run_top
from pskv.transport.security import generate_keys, write_key_file


def _info(args: argparse.Namespace) -> int:
    info: dict[str, object] = {
        "pskv": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "store_types": known_types(),
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        info["torch"] = torch.__version__
        info["cuda_devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        info["torch"] = None
    try:
        config = Config.from_env()
    except InvalidArgumentError as exc:  # e.g. PSKV_ENGINE_THREADS=0
        print(f"pskv info: error: {exc}", file=sys.stderr)
        return 2
    info["settings"] = {var: getattr(config, field) for var, (field, _doc) in ENV_VARS.items()}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:12} {v}")
    return 0


def _role(role: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        # run_role shows pskv's records (pskv.logs: time, level, node; PSKV_LOG_LEVEL)
        try:
            cluster = ClusterConfig.from_env(role=role)
            return run_role(cluster, port_file=getattr(args, "port_file", None))
        except InvalidArgumentError as exc:  # e.g. a bad CURVE key file: refused before binding anything
            print(f"pskv {role}: error: {exc}", file=sys.stderr)
            return 2
        except TransportError as exc:  # e.g. the port is taken
            print(f"pskv {role}: error: {exc}", file=sys.stderr)
            return 1
    return run


def _keygen(args: argparse.Namespace) -> int:
    try:
        keys = generate_keys()
        path = write_key_file(args.output, keys, overwrite=args.force)
    except InvalidArgumentError as exc:
        print(f"pskv keygen: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # no such folder, a folder at the path, ... (named by the user's path, not the temporary's)
        print(f"pskv keygen: error: cannot write {args.output}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} (mode 600), public key {keys.public.decode()}")
    print(f"use it with: pskv launch --curve-key {path} ...  (or PSKV_CURVE_KEY_FILE={path})")
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    """``pskv checkpoint DIR``: the checkpoints under DIR (or DIR itself), each verified.

    Both kinds (:mod:`pskv.checkpoints`): server checkpoints (``ckpt-<n>``, from
    ``kv.save_checkpoint``) and training checkpoints (``epoch-<n>``, from ``fit``). In a
    directory of them, other folders (``fit``'s ``.epoch-<n>.tmp``, ``tensorboard/``) are not
    checkpoints and are left out.
    """
    root = Path(args.directory)
    if kind_of(root) is not None or is_checkpoint_name(root.name):
        candidates = [root]  # one checkpoint
    elif root.is_dir():  # a directory of them
        candidates = sorted((d for d in root.iterdir() if d.is_dir() and is_checkpoint_name(d.name)),
                            key=lambda d: d.name)
    else:
        candidates = []
    if not candidates:
        print(f"pskv checkpoint: error: {root} holds no checkpoint", file=sys.stderr)
        return 2
    newest = {latest_server_checkpoint(root), latest_training_checkpoint(root)}
    bad = 0
    for d in candidates:
        try:
            line = _verify_training(d) if kind_of(d) is Kind.TRAINING else _verify_server(d)
        except (KVStoreError, KeyError, TypeError, ValueError, OSError) as exc:
            bad += 1
            print(f"{d}: NOT usable: {exc}")
            continue
        mark = "  (newest: a restart resumes from it)" if d in newest else ""
        print(f"{d}: ok, {line}{mark}")
    return 1 if bad else 0


def _verify_server(d: Path) -> str:
    """Read a server checkpoint's manifest and every server's file; one line describing it."""
    manifest = read_manifest(d)
    parts = 0
    for rank in range(int(manifest["num_servers"])):
        parts += len(read_shard(d, rank).parts)
    return (f"server checkpoint, {manifest.get('store')} with {manifest['num_servers']} server(s), {parts} part(s), "
            f"{int(manifest.get('bytes', 0)):,} bytes, open rounds {manifest.get('open_rounds', 0)}, "
            f"meta {json.dumps(manifest.get('meta'))}")


def _verify_training(d: Path) -> str:
    """Read a training checkpoint whole, with the readers ``load_checkpoint`` uses
    (:mod:`pskv.parallel.checkpoint`): its meta, its parameters, its optimizer state and every
    file its meta names (residuals, tables, the server checkpoint of a ``dist_*`` store's
    tables); one line describing it.

    Raises:
        CheckpointError: (or a pskv or OS error) a file is missing or damaged, naming it; or
            PyTorch, which reads the parameters, is not installed.
    """
    meta = read_json(d / TRAINING_META)
    if not isinstance(meta, dict) or "epoch" not in meta:
        raise CheckpointError(f"{d / TRAINING_META} is not a pskv training checkpoint's meta")
    try:
        from pskv.parallel import checkpoint as training  # PyTorch: only a training checkpoint needs it
    except ImportError as exc:
        raise CheckpointError(f"reading a training checkpoint needs PyTorch ({exc})") from None
    arg, aux = training.load_params(d / training.PARAMS)
    for path in _optimizer_files(d / training.OPTIMIZER):
        try:
            optimizer_states.load(path)
        except OptimizerStateError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
    if meta.get("residuals") is not None:
        read_store_file(d / str(meta["residuals"]))
    held = meta.get("tables")
    if held is not None and not (isinstance(held, dict) and isinstance(held.get("tables"), list)
                                 and ("file" in held or "servers" in held)):
        raise CheckpointError(f"{d / TRAINING_META}: its 'tables' entry is malformed ({held!r:.80})")
    if held is not None and "file" in held:
        training._read_tables(d / str(held["file"]), held["tables"])
    servers = d / str(held["servers"]) if held is not None and "servers" in held else d / training.SERVERS
    if servers.exists() or held is not None and "servers" in held:
        _verify_server(servers)
    return (f"training checkpoint, epoch {int(meta['epoch']) + 1} done, store {meta.get('store')}, "
            f"{len(arg) + len(aux)} parameter tensor(s), update_on_kvstore={meta.get('update_on_kvstore')}"
            + (f", {len(held['tables'])} embedding table(s)" if held is not None else ""))


def _optimizer_files(path: Path) -> list[Path]:
    """A training checkpoint's optimizer-state files: ``path``, or a ``dist_*`` store's
    ``<path>.server<rank>`` for every server (``update_on_kvstore``)."""
    if path.is_file():
        return [path]
    per_server: list[Path] = []
    while (file := path.with_name(f"{path.name}.server{len(per_server)}")).is_file():
        per_server.append(file)
    if not per_server:
        raise CheckpointError(f"{path} is missing (and no {path.name}.server0): the optimizer state")
    return per_server


def _timeline(args: argparse.Namespace) -> int:
    """``pskv timeline PATH...``: timeline files (a directory: its ``*.json``) summed up per process and
    span; with ``-o FILE`` merged into one file (:func:`pskv.timeline.merge`)."""
    files: list[Path] = []
    output = Path(args.output).resolve() if args.output else None
    for path in map(Path, args.paths):  # a directory's merged outputs (pskv timeline -o) are not its processes'
        files += sorted(p for p in path.glob("*.json") if p.resolve() != output and not is_merged(p)) \
            if path.is_dir() else [path]
    if not files:
        print(f"pskv timeline: error: no timeline files in {' '.join(args.paths)}", file=sys.stderr)
        return 2
    try:
        events = load_timeline(files)  # once: a file cut short is warned of once
        if args.output:
            write_merged(events, len(files), args.output)
    except (InvalidArgumentError, OSError) as exc:
        print(f"pskv timeline: error: {exc}", file=sys.stderr)
        return 2
    print(f"{'process':<12} {'span':<10} {'count':>8} {'total ms':>12} {'mean us':>10}")
    for process, name, count, ms in timeline_summary(events):
        print(f"{process:<12} {name:<10} {count:>8} {ms:>12.3f} {ms * 1000 / count:>10.1f}")
    for worker, count, rounds, ms in timeline_stragglers(events):
        print(f"{worker} came last in {count} of {rounds} rounds ({100 * count / rounds:.0f}%), "
              f"{ms:.3f} ms after the one before it in all")
    if args.output:
        print(f"{len(events)} events of {len(files)} file(s) written to {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``pskv`` command."""
    parser = argparse.ArgumentParser(prog="pskv", description="pskv: parameter server and key-value store")
    parser.add_argument("--version", action="version", version=f"pskv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="show versions, backends and resolved settings")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.set_defaults(func=_info)
    for role in ("scheduler", "server"):
        p = sub.add_parser(role, help=f"run the {role} role until the job ends (DMLC_* environment)")
        if role == "scheduler":  # only the scheduler binds the port the others connect to
            p.add_argument("--port-file", default=None,
                           help="with DMLC_PS_ROOT_PORT=0, bind a free port and write it (the port only) to this file")
        p.set_defaults(func=_role(role))
    p_keygen = sub.add_parser("keygen", help="write a CURVE cluster key file (authenticated, encrypted jobs)")
    p_keygen.add_argument("-o", "--output", default="pskv-cluster.key", metavar="FILE",
                          help="the key file to write (default: pskv-cluster.key; never overwritten without --force)")
    p_keygen.add_argument("--force", action="store_true", help="overwrite an existing file")
    p_keygen.set_defaults(func=_keygen)
    p_ckpt = sub.add_parser("checkpoint", help="list and verify checkpoints (kv.save_checkpoint, fit checkpoint_dir)")
    p_ckpt.add_argument("directory", help="a checkpoint directory, or a directory holding ckpt-<n> / epoch-<n> ones")
    p_ckpt.set_defaults(func=_checkpoint)
    p_timeline = sub.add_parser("timeline", help="sum up a job's timeline files (PSKV_TIMELINE) and merge them")
    p_timeline.add_argument("paths", nargs="+", metavar="PATH", help="timeline files, or directories of them")
    p_timeline.add_argument("-o", "--output", default=None, metavar="FILE",
                            help="write every file's events into FILE (one trace of the whole job)")
    p_timeline.set_defaults(func=_timeline)
    p_top = sub.add_parser("top", help="show a running job's nodes live: rounds/s, bytes/s, queues, stalls",
                           description="Attach to a running job through its scheduler and show its nodes "
                                       "(docs/observability.md).")
    add_top_arguments(p_top)
    p_top.set_defaults(func=run_top)
    p_launch = sub.add_parser("launch", help="start a job (scheduler, servers, workers) and supervise it",
                              description=LAUNCH_DESCRIPTION)
    add_launch_arguments(p_launch)
    p_launch.set_defaults(func=run_launch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pskv`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
