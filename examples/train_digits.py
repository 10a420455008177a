"""Data-parallel training of real models on scikit-learn's handwritten digits through pskv.

The main job of the README:

    pskv launch -n 2 -s 2 -- python examples/train_digits.py

The launcher starts a scheduler, 2 servers and 2 workers on this machine. Every worker
builds the same model (each with its own random initialisation: the Trainer's first
forward broadcasts rank 0's parameters), trains on its own half of every global batch
(``NDArrayIter(..., num_parts=2, part_index=rank)``), and sends its gradients to the
servers during backward; the servers sum both workers' gradients and run the optimizer
(``update_on_kvstore``), and the new weights come back to both workers. Two models are
trained one after the other: an MLP (SGD with momentum) and a small CNN (Adam). Each
must reach the test accuracy given by ``--min-accuracy`` (default 95 %), or the job fails.

Without the launcher (no ``DMLC_ROLE`` in the environment) it trains in one process with
``--devices`` CPU replicas, which sum their gradients in a ``local`` store (one replica has
nothing to sum and needs no store: its optimizer runs in the process).

``--compression TYPE`` (``2bit``, ``1bit``, ``topk``, ...: any registered type, with its
defaults) compresses every gradient a worker sends (``Trainer(compression_params=...)``,
the store's ``set_gradient_compression``; ``--threshold``, default 0.5, for the types that
take one). Compressed gradients arrive as steps of ``±threshold``, signs or sparse bursts
of error feedback: both models then train with Adam (which scales each step itself; SGD
with momentum diverges on ``onebit``, ``topk`` and ``dithering`` here) for 30 epochs each
unless ``--epochs`` says otherwise. ``--adam`` trains an uncompressed run the same way
(the baseline compressed runs compare with), ``--seed`` another initialisation and data
order.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
except ModuleNotFoundError as exc:  # say which extra brings it, not just what is missing
    missing = (exc.name or "").split(".")[0]
    if missing not in ("torch", "sklearn"):
        raise
    sys.exit(f"train_digits.py needs {missing} (PyTorch and scikit-learn): "
             "python -m pip install -e '.[torch,examples]'")

import pskv
from pskv.compression import COMPRESSORS
from pskv.compression import create as create_compressor
from pskv.errors import CheckpointError, InvalidArgumentError, OptimizerStateError
from pskv.parallel import DataParallelExecutorGroup, NDArrayIter, Trainer, evaluate


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The 1,797 8x8 digits, scaled to [0, 1], split 80/20 (stratified, fixed seed)."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]  # N, 1, 8, 8
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    return x_train, y_train, x_test, y_test


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 4 * 4, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


MODELS = {
    "mlp": (mlp, "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}, 20),
    "cnn": (cnn, "adam", {"learning_rate": 2e-3}, 15),
}


def train(name: str, kv: pskv.KVStoreBase | None, args: argparse.Namespace,
          data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> float:
    """Train one model; returns its test accuracy."""
    factory, optimizer, params, default_epochs = MODELS[name]
    if args.compression or args.adam:  # compressed gradients: Adam scales each step, and more epochs (see --compression)
        optimizer, params, default_epochs = "adam", {"learning_rate": 2e-3}, 30
    rank, workers = (kv.rank, kv.num_workers) if kv is not None else (0, 1)
    x_train, y_train, x_test, y_test = data
    torch.manual_seed(1000 + rank + 100 * args.seed)  # deliberately different on every worker
    devices = ["cpu"] * args.devices
    group = DataParallelExecutorGroup(factory(), devices, loss=torch.nn.CrossEntropyLoss())
    compression = compression_params(args)
    trainer = Trainer(group, optimizer, params, kvstore=kv if kv is not None else "local", prefix=f"{name}.",
                      compression_params=compression)
    train_iter = NDArrayIter(x_train, y_train, batch_size=args.batch, shuffle=True, seed=7 + args.seed,
                             num_parts=workers, part_index=rank)
    test_iter = NDArrayIter(x_test, y_test, batch_size=len(x_test))  # the whole test set, every worker
    if rank == 0:
        print(f"[{name}] {sum(p.numel() for p in group.replicas[0].parameters()):,} parameters, "
              f"{optimizer} {params}, {workers} worker(s) x {args.batch} samples per step, "
              f"store {trainer.kvstore.type if trainer.kvstore is not None else 'none (one device: nothing to sum)'}, "
              f"update_on_kvstore={trainer.update_on_kvstore}"
              + (f", compression {compression}" if compression else ""),
              flush=True)
    checkpoints = os.path.join(args.checkpoint_dir, name) if args.checkpoint_dir else None
    history = trainer.fit(train_iter, test_iter, num_epoch=args.epochs or default_epochs, eval_metric="acc",
                          checkpoint_dir=checkpoints, resume=args.resume)
    # a resumed run whose checkpoint already holds every epoch trains nothing: score the model it loaded
    accuracy = history[-1]["eval"]["accuracy"] if history else evaluate(group, test_iter, "acc")["accuracy"]
    trainer.close()
    group.close()
    return float(accuracy)


def compression_params(args: argparse.Namespace) -> dict[str, object] | None:
    """``Trainer(compression_params=...)`` from ``--compression`` and its options (None: no compression)."""
    if not args.compression:
        return None
    params: dict[str, object] = {"type": args.compression}
    if "threshold" in COMPRESSORS[args.compression].defaults:  # only the types that take one (2bit, 1bit)
        params["threshold"] = args.threshold
    for setting in args.compression_param:
        param, _, value = setting.partition("=")
        params[param] = value  # a string: the compressor converts and checks it
    return params


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad options with a usage message (exit status 2) before anything starts, not a traceback later."""
    for option, value, least in (("--epochs", args.epochs, 0), ("--batch", args.batch, 1),
                                 ("--devices", args.devices, 1)):
        if value < least:
            parser.error(f"{option} must be >= {least}, got {value}")
    if not 0.0 <= args.min_accuracy <= 1.0:
        parser.error(f"--min-accuracy is a fraction in [0, 1] (0.95 for 95 %), got {args.min_accuracy}")
    if args.resume and not args.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir (the directory the checkpoints were saved in)")
    if args.compression_param and not args.compression:
        parser.error("--compression-param needs --compression")
    for setting in args.compression_param:
        if not setting.partition("=")[0] or "=" not in setting:
            parser.error(f"--compression-param takes NAME=VALUE, got {setting!r}")
    try:
        compression = compression_params(args)
        if compression is not None:
            create_compressor(compression)  # unknown parameters, bad values: named here
    except InvalidArgumentError as exc:
        parser.error(str(exc))


def open_store(parser: argparse.ArgumentParser, args: argparse.Namespace) -> pskv.KVStoreBase | None:
    """The ``--store`` (default: ``dist_sync`` under the launcher); None: each Trainer makes its own ``local`` one."""
    store = args.store or ("dist_sync" if os.environ.get("DMLC_ROLE") else None)
    try:
        return pskv.create(store) if store else None
    except InvalidArgumentError as exc:  # an unknown type, a dist_* store outside the launcher
        parser.error(str(exc))


def percent(fraction: float) -> str:
    """``0.95`` -> ``95%``, ``0.999`` -> ``99.9%`` (no rounding up to a bar the run did not ask for)."""
    return f"{100 * fraction:g}%"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    parser.add_argument("--epochs", type=int, default=0,
                        help="epochs per model (default: 20 MLP, 15 CNN; 30 each with --compression or --adam)")
    parser.add_argument("--batch", type=int, default=32, help="samples per worker per step")
    parser.add_argument("--store", default=None,
                        help="store type (default: dist_sync under the launcher, else local; one device "
                             "without --compression needs none: nothing to sum)")
    parser.add_argument("--devices", type=int, default=1, help="CPU replicas per worker")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="save a checkpoint every epoch there (a subdirectory per model)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --checkpoint-dir (from scratch if none)")
    parser.add_argument("--min-accuracy", type=float, default=0.95,
                        help="test accuracy each model must reach, a fraction (default 0.95); below it the exit "
                             "status is 1")
    parser.add_argument("--compression", choices=sorted(COMPRESSORS), default=None,
                        help="compress the gradients sent to the store (set_gradient_compression)")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="the compression's threshold, for the types that take one (default 0.5)")
    parser.add_argument("--compression-param", action="append", default=[], metavar="NAME=VALUE",
                        help="another parameter of the compression (e.g. k=0.05 for topk); repeatable")
    parser.add_argument("--adam", action="store_true",
                        help="train as compressed runs do (Adam, 30 epochs) without compression: their baseline")
    parser.add_argument("--seed", type=int, default=0, help="another initialisation and data order (default 0)")
    args = parser.parse_args()
    check_args(parser, args)
    args.kv = open_store(parser, args)
    return args


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)  # the launcher runs several processes on this machine
    kv = args.kv
    rank = kv.rank if kv is not None else 0
    data = load_data()
    if rank == 0:
        print(f"pskv {pskv.__version__}: digits, {len(data[0])} training / {len(data[2])} test images", flush=True)
    start = time.perf_counter()
    results = {}
    try:
        for name in (["mlp", "cnn"] if args.model == "both" else [args.model]):
            results[name] = train(name, kv, args, data)
    except (InvalidArgumentError, CheckpointError, OptimizerStateError) as exc:  # e.g. a checkpoint of other options
        print(f"{os.path.basename(sys.argv[0])}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if kv is not None:
            kv.close()
    failed = {k: v for k, v in results.items() if not v >= args.min_accuracy}
    if rank == 0:
        summary = ", ".join(f"{k} {v:.2%}" for k, v in results.items())
        print(f"test accuracy: {summary} (needed {percent(args.min_accuracy)}) in {time.perf_counter() - start:.1f} s",
              flush=True)
        if failed:
            print(f"FAILED: {sorted(failed)} below {percent(args.min_accuracy)}", file=sys.stderr, flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
