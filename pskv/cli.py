"""The ``pskv`` console command.

Subcommands:
    pskv info      versions, optional backends (PyTorch, CUDA) and resolved settings
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
from collections.abc import Sequence

import numpy as np

from pskv import __version__
from pskv.config import ENV_VARS, Config
from pskv.kvstore import known_types


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
    config = Config.from_env()
    info["settings"] = {var: getattr(config, field) for var, (field, _doc) in ENV_VARS.items()}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        for k, v in info.items():
            print(f"{k:12} {v}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``pskv`` command."""
    parser = argparse.ArgumentParser(prog="pskv", description="pskv: parameter server and key-value store")
    parser.add_argument("--version", action="version", version=f"pskv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="show versions, backends and resolved settings")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    p_info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pskv`` command; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
