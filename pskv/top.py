"""``pskv top``: a running job's nodes, live in the terminal, from its scheduler (:mod:`pskv.metrics`).

Usage::

    pskv top --scheduler HOST:PORT      # or --port-file F (pskv launch --address-file F writes it)
             [--interval S] [--once] [--json] [--curve-key FILE] [--timeout S]

Every ``--interval`` seconds it asks the scheduler for the job's metrics and redraws one
row per node (rich's ``Live``): state, ops/s, rounds/s, bytes/s in and out, queue,
stalls (and the node they wait for), the share of time a worker waited for replies, and
how long ago the scheduler heard from it. ``--once`` prints one table and exits; ``--json`` prints JSON instead (one
object per line, one line per refresh). When the job ends (the scheduler's connection
closes, or it stops answering after it did) top prints one line saying so (on stderr with
``--json``) and exits 0;
a scheduler that never answers is one line naming its address after ``--timeout``, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table

from pskv.errors import InvalidArgumentError, KVStoreError, NodeFailedError, OperationTimeoutError
from pskv.metrics import JobMetrics, MetricsClient, NodeMetrics

__all__ = ["add_arguments", "run", "render"]

EXIT_OK = 0
EXIT_UNREACHABLE = 1  # the scheduler never answered, refused, or answered nonsense
EXIT_USAGE = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``pskv top``."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", metavar="HOST:PORT",
                       help="the job's scheduler (pskv launch prints it and writes it with --address-file)")
    where.add_argument("--port-file", metavar="FILE",
                       help="a file holding the scheduler's HOST:PORT (pskv launch --address-file) or its port "
                            "(pskv scheduler --port-file writes only the port; a bare port means 127.0.0.1)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true", help="print the nodes once and exit")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per refresh) instead of a table")
    parser.add_argument("--curve-key", metavar="FILE", default="",
                        help="the job's CURVE key file, if it runs with one (pskv launch --curve-key)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for each answer of the scheduler (default 5)")


def run(args: argparse.Namespace) -> int:
    """``pskv top``; returns its exit code (Ctrl-C: 0)."""
    try:
        return _run(args)
    except KeyboardInterrupt:
        return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.timeout <= 0:
        _error("--interval and --timeout must be > 0")
        return EXIT_USAGE
    try:
        address = _address(args)
        client = MetricsClient(address, args.curve_key)
    except KVStoreError as exc:
        _error(exc)
        return EXIT_USAGE
    with client:
        try:
            first = client.query(args.timeout)
        except KVStoreError as exc:
            _error(exc)
            return EXIT_UNREACHABLE
        if args.once:
            _show(first, args.json)
            return EXIT_OK
        return _follow(client, first, args)


def _error(what: object) -> None:
    """One line on stderr: ``pskv top: error: ...``."""
    print(f"pskv top: error: {what}", file=sys.stderr, flush=True)


def _address(args: argparse.Namespace) -> str:
    """The scheduler's address from ``--scheduler`` or ``--port-file``."""
    if args.scheduler:
        return str(args.scheduler)
    if not args.port_file:
        raise InvalidArgumentError("give the job's scheduler: --scheduler HOST:PORT or --port-file FILE")
    try:
        text = Path(args.port_file).read_text(encoding="utf-8")[:300]
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(f"cannot read the scheduler's address from {args.port_file}: {exc}") from None
    return text.strip()


def _show(metrics: JobMetrics, as_json: bool) -> None:
    if as_json:
        print(json.dumps(metrics.as_dict()), flush=True)
    else:
        Console().print(render(metrics))


def _follow(client: MetricsClient, metrics: JobMetrics, args: argparse.Namespace) -> int:
    """Refresh until the job ends (exit 0) or the user interrupts (exit 0)."""
    out = Console()
    live = None if args.json else Live(render(metrics), console=out, auto_refresh=False, transient=False)
    try:
        if live is None:
            _show(metrics, True)
        else:
            live.start(refresh=True)
        while True:
            time.sleep(args.interval)
            try:
                metrics = client.query(args.timeout)
            except (NodeFailedError, OperationTimeoutError) as exc:
                if live is not None:
                    live.stop()
                    live = None
                why = "its scheduler closed the connection" if isinstance(exc, NodeFailedError) \
                    else f"its scheduler stopped answering: nothing for {args.timeout:g} s"
                print(f"pskv top: the job at {client.address.removeprefix('tcp://')} ended ({why})", flush=True,
                      file=sys.stderr if args.json else sys.stdout)  # JSON lines stay JSON
                return EXIT_OK
            if live is None:
                _show(metrics, True)
            else:
                live.update(render(metrics), refresh=True)
    except KeyboardInterrupt:
        return EXIT_OK
    except KVStoreError as exc:
        _error(exc)
        return EXIT_UNREACHABLE
    finally:
        if live is not None:
            live.stop()


def render(metrics: JobMetrics) -> Table:
    """The table of one snapshot."""
    expected = metrics.num_workers + metrics.num_servers
    title = (f"pskv job at {metrics.address.removeprefix('tcp://')}: {metrics.num_servers} server(s), "
             f"{metrics.num_workers} worker(s)" + (f" (elastic: view {metrics.view})" if metrics.view else ""))
    if metrics.registered < expected:
        title += f", {metrics.registered} of {expected} registered so far"
    # narrow enough for an 80-column terminal: no vertical rules, one space between columns
    table = Table(title=title, title_justify="left", caption=time.strftime("%H:%M:%S"), caption_justify="left",
                  box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, show_edge=False)
    for name, justify in (("node", "left"), ("state", "left"), ("ops/s", "right"), ("rounds/s", "right"),
                          ("in/s", "right"), ("out/s", "right"), ("queue", "right"), ("stalls", "right"),
                          ("wait", "right"), ("heard", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for node in metrics.nodes:
        table.add_row(*_row(node))
    return table


def _row(node: NodeMetrics) -> tuple[str, ...]:
    style = {"alive": "", "dead": "[bold red]", "left": "[dim]"}.get(node.state, "")
    return (f"{style}{node.node}", f"{style}{node.state}", _number(node.ops_per_s), _number(node.rounds_per_s),
            _bytes(node.bytes_in_per_s), _bytes(node.bytes_out_per_s), str(node.queue),
            f"[yellow]{node.stalls}" + (f" ({node.waits_for})" if node.waits_for else "") if node.stalls else "0",
            "-" if node.wait_per_s is None or node.role == "server" else f"{100 * min(1.0, node.wait_per_s):.0f}%",
            f"{node.age:.1f}s")


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("", "k", "M", "G"):
        if value < 999.95 or unit == "G":
            return f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}G"  # pragma: no cover - the loop returns


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1023.95 or unit == "GiB":
            return f"{value:.0f}B" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:,.1f} GiB"  # pragma: no cover - the loop returns
