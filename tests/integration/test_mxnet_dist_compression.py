"""MXNet's own distributed compression test, ``tests/nightly/dist_sync_kvstore.py --type
compressed_cpu_2bit`` and ``compressed_cpu_1bit``, ported to pskv and run through ``pskv launch``
with 2 workers and 2 servers.

The checks are MXNet's, in its order and with its keys and shapes: a (2, 3) key, a (1211, 1211)
key and a (1200, 1200) key (both bigger than MXNet's big-array bound: split over the servers),
keys initialised to ones that compression must leave alone, pulls before any push, residuals
that build up below the threshold and are sent once they reach it, and 7 pushes of random
gradients against a transcription of the quantizer. Every value is compared exactly (the
random rounds within MXNet's ``assert_almost_equal`` tolerance).

One difference, written where it applies: MXNet's servers run its ``test`` optimizer, which
*adds* ``rate * grad`` to the weight; pskv has no such optimizer, so the servers run
``SGD(learning_rate=rate)``, which subtracts it, and every expected step changes sign.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(r'''
    import sys
    import numpy as np
    import pskv
    from pskv.optimizer import SGD

    kind, threshold, nrepeat = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    rate = 2.0  # MXNet's rescale_grad of its test optimizer
    shape, irregular, big = (2, 3), (1211, 1211), (1200, 1200)
    compr_keys = [("1000", shape), ("1200", irregular), ("1300", big)]
    compr_init_keys = [("1001", shape), ("1201", irregular), ("1301", big)]
    compr_random_keys = [("1002", shape), ("1202", irregular), ("1302", big)]

    kv = pskv.create("dist_sync")
    nworker = kv.num_workers
    kv.set_gradient_compression({"type": kind, "threshold": threshold})
    for k, s in compr_keys:
        kv.init(k, np.zeros(s, np.float32))
    for k, s in compr_init_keys:  # initialised to ones: init is never compressed
        kv.init(k, np.ones(s, np.float32))
    kv.set_optimizer(SGD(learning_rate=rate))  # MXNet: its 'test' optimizer, weight += rate * grad

    def pulled(k, s, fill=0.0):
        out = np.full(s, fill, np.float32)
        kv.pull(k, out=out)
        return out

    def check(out, x, what):
        assert np.array_equal(out, np.broadcast_to(np.float32(x), out.shape)), (kv.rank, what, out.ravel()[:4], x)

    def quantize(grad, residual):
        """MXNet's quantizer (compute_2bit / compute_1bit of its test_kvstore.py), transcribed."""
        t = np.float32(threshold)
        residual += grad
        if kind == "2bit":
            sent = np.where(residual >= t, t, np.where(residual <= -t, -t, np.float32(0)))
        else:
            sent = np.where(residual > t, np.float32(1), np.float32(-1))
        residual -= sent
        return sent

    def pull_before_push():
        for k, s in compr_keys:
            check(pulled(k, s, 1.0), 0.0, "pull before push")
        for k, s in compr_init_keys:
            check(pulled(k, s, 0.0), 1.0, "init is not compressed")

    def random_pushes():
        rnd = np.random.RandomState(123)  # the same on every worker: each knows the others' gradients
        for k, s in compr_random_keys:
            kv.init(k, np.zeros(s, np.float32))
        for k, s in compr_random_keys:
            residual = np.zeros(s, np.float32)
            for _ in range(nrepeat):
                before = pulled(k, s)
                grad = rnd.rand(*s).astype(np.float32)
                kv.push(k, grad)
                diff = pulled(k, s) - before
                want = -quantize(grad, residual) * nworker * rate  # MXNet: +
                np.testing.assert_allclose(diff, want, rtol=1e-5, atol=1e-20)  # assert_almost_equal's

    if kind == "2bit":
        pull_before_push()
        for k, s in compr_keys:  # zeros: nothing to send
            kv.push(k, np.zeros(s, np.float32))
            check(pulled(k, s, 1.0), 0.0, "zeros")
        for k, s in compr_keys:  # residuals
            kv.push(k, np.full(s, 0.4, np.float32))  # below the threshold
            check(pulled(k, s), 0.0, "0.4 stays")
            kv.push(k, np.full(s, threshold - 0.4, np.float32))  # reaches it with the residual
            value = -threshold * rate * nworker  # MXNet: +
            check(pulled(k, s), value, "0.4 + 0.1 sent")
            kv.push(k, np.full(s, 0.2, np.float32))
            check(pulled(k, s), value, "0.2 stays")
            kv.push(k, np.full(s, threshold - 0.2, np.float32))
            value -= threshold * rate * nworker
            check(pulled(k, s), value, "0.2 + 0.3 sent")
        for k, s in compr_keys:  # exactly the threshold
            value = pulled(k, s)[0, 0]
            kv.push(k, np.full(s, threshold, np.float32))
            check(pulled(k, s), value - rate * nworker * threshold, "threshold")
        random_pushes()
    else:
        pull_before_push()
        for k, s in compr_keys:  # ones: +1 each
            value = pulled(k, s)[0, 0]
            kv.push(k, np.ones(s, np.float32))
            check(pulled(k, s), value - rate * nworker, "ones")
        for k, s in compr_keys:  # minus ones: -1 each, back to zero
            kv.push(k, -np.ones(s, np.float32))
            check(pulled(k, s, 1.0), 0.0, "minus ones")
        residual = 0.0  # MXNet's check_compr_residual, the same arithmetic
        value = -(rate * nworker if 2 + residual > threshold else -rate * nworker)
        for k, s in compr_keys:
            kv.push(k, np.full(s, 2.0, np.float32))
            check(pulled(k, s), value, "2")
        residual = 1 if 2 > threshold else 3
        value -= rate * nworker if 0 + residual > threshold else -rate * nworker
        for k, s in compr_keys:
            kv.push(k, np.zeros(s, np.float32))
            check(pulled(k, s), value, "0 after 2")
        residual += -1 if residual > threshold else +1
        value -= rate * nworker if -2 + residual > threshold else -rate * nworker
        for k, s in compr_keys:
            kv.push(k, np.full(s, -2.0, np.float32))
            check(pulled(k, s), value, "-2")
        random_pushes()
    print(f"worker {kv.rank} is done with {kind} compression tests", flush=True)
    kv.close()
''')


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind, threshold", [("2bit", 0.5), ("1bit", 0.0)])  # MXNet's: init_kv_compressed
def test_mxnets_dist_sync_compression_test_passes_through_pskv_launch(kind, threshold):
    argv = [sys.executable, "-m", "pskv", "launch", "-n", "2", "-s", "2", "--stop-grace", "2", "--timeout", "120",
            "--", sys.executable, "-c", WORKER, kind, str(threshold), "7"]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=140,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for rank in (0, 1):
        assert f"worker {rank} is done with {kind} compression tests" in out, out
