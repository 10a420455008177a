"""keep_freed_memory: freed message buffers are reused instead of page-faulting anew."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc malloc settings")

PROGRAM = textwrap.dedent("""
    import resource, sys
    from pskv.cluster.runtime import NodeRuntime
    from pskv.config import ClusterConfig

    runtime = NodeRuntime("pskv-test", cluster=ClusterConfig.from_env({"PSKV_KEEP_FREED_BYTES": sys.argv[1]}))
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):  # warm up: the heap grows to hold a round's buffers
        held = [bytearray(4 << 20) for _ in range(8)]  # like 8 received 4 MiB pieces, then freed
        del held
    before = faults()
    for _ in range(10):
        held = [bytearray(4 << 20) for _ in range(8)]
        del held
    runtime.stop()
    print((faults() - before) // 10)
""")


def faults_per_round(*keeps: int) -> list[int]:
    """Page faults per round in a fresh process for each setting (the processes run at once)."""
    procs = [subprocess.Popen([sys.executable, "-c", PROGRAM, str(keep)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for keep in keeps]
    outs = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        assert proc.returncode == 0, err
        outs.append(int(out.split()[-1]))
    return outs


def test_a_node_keeps_freed_buffers_so_the_next_ones_do_not_fault():
    kept, default = faults_per_round(1 << 30, 0)
    assert default > 4000  # 32 MiB handed back and faulted in again: ~8192 pages per round
    assert kept < 200
