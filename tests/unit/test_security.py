"""CURVE key files, `pskv keygen` and the launcher's security options."""

from __future__ import annotations

import logging
import os
import stat

import numpy as np
import pytest
import zmq

import pskv
from pskv.cli import main as cli_main
from pskv.launch.config import LaunchConfig
from pskv.testing import InProcessCluster
from pskv.transport.security import CurveSecurity, generate_keys, read_key_file, write_key_file

pytestmark = pytest.mark.skipif(not zmq.has("curve"), reason="libzmq without CURVE")


def test_key_file_round_trip_is_private_and_atomic(tmp_path):
    keys = generate_keys()
    path = write_key_file(tmp_path / "k", keys)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key_file(path) == keys
    assert "secret" not in repr(keys).lower().replace("secret=<hidden>", "")
    with pytest.raises(pskv.InvalidArgumentError, match="refusing to overwrite"):
        write_key_file(path, generate_keys())
    write_key_file(path, generate_keys(), overwrite=True)
    assert read_key_file(path) != keys
    assert sorted(os.listdir(tmp_path)) == ["k"]  # no temporaries left


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda t: t.replace("public = ", "public = x"), "40 characters"),
    (lambda t: "\n".join(line for line in t.splitlines() if not line.startswith("secret")), "'secret'"),
    (lambda t: t + "garbage line\n", "malformed"),
])
def test_bad_key_files_are_refused_with_the_reason(tmp_path, mutate, match):
    path = write_key_file(tmp_path / "k", generate_keys())
    path.write_text(mutate(path.read_text()))
    with pytest.raises(pskv.InvalidArgumentError, match=match):
        read_key_file(path)


def test_a_public_key_of_another_pair_or_a_shared_file_is_refused(tmp_path):
    a, b = generate_keys(), generate_keys()
    path = tmp_path / "k"
    path.write_text(f"public = {a.public.decode()}\nsecret = {b.secret.decode()}\n")
    path.chmod(0o600)
    with pytest.raises(pskv.InvalidArgumentError, match="does not belong"):
        read_key_file(path)
    good = write_key_file(tmp_path / "g", a)
    good.chmod(0o644)
    with pytest.raises(pskv.InvalidArgumentError, match="chmod 600"):
        read_key_file(good)
    with pytest.raises(pskv.InvalidArgumentError, match="cannot read"):
        read_key_file(tmp_path / "missing")


def test_zap_admits_only_the_cluster_key_and_logs_refusals(caplog):
    keys, intruder = generate_keys(), generate_keys()
    ctx = zmq.Context()
    sec = CurveSecurity(keys, "server 0")
    sec.start(ctx)
    router = ctx.socket(zmq.ROUTER)
    sec.server(router)
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def send(mode: str) -> bool:
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        if mode == "member":
            sec.client(dealer)
        elif mode == "intruder":
            CurveSecurity(intruder).client(dealer)
            dealer.curve_serverkey = keys.public  # knows the public key, not the secret
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(mode.encode())
        got = router.poll(1000) and router.recv_multipart()[-1] == mode.encode()
        dealer.close()
        return bool(got)

    try:
        with caplog.at_level("ERROR", logger="pskv.security"):
            assert send("member")
            assert not send("intruder")
            assert not send("plain")
        assert sec.refused == 1
        assert intruder.public.decode() in caplog.text and "server 0 refused" in caplog.text
    finally:
        sec.stop()
        router.close(0)
        ctx.term()


def test_keygen_command(tmp_path, capsys):
    out = tmp_path / "cluster.key"
    assert cli_main(["keygen", "-o", str(out)]) == 0
    assert read_key_file(out).public.decode() in capsys.readouterr().out
    assert cli_main(["keygen", "-o", str(out)]) == 2
    assert "refusing to overwrite a key file (remove it first, or pass --force)" in capsys.readouterr().err
    assert cli_main(["keygen", "-o", str(out), "--force"]) == 0
    capsys.readouterr()
    # a path that cannot be written: one error line, exit 2, and no temporary copy of the secret key left behind
    (tmp_path / "folder").mkdir()
    for path, why in ((tmp_path / "missing" / "dir" / "k.key", "No such file or directory"),
                      (tmp_path / "folder", "Is a directory")):
        assert cli_main(["keygen", "-o", str(path), "--force"]) == 2
        assert capsys.readouterr().err == f"pskv keygen: error: cannot write {path}: {why}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.key", "folder"] and not any((tmp_path / "folder").iterdir())


def test_launcher_security_options_are_checked():
    with pytest.raises(pskv.InvalidArgumentError, match="not both"):
        LaunchConfig(1, 1, ("true",), curve_key_file="/k", secure=True)
    with pytest.raises(pskv.InvalidArgumentError, match="--secure makes a key on this machine only"):
        LaunchConfig(1, 1, ("true",), launcher="ssh", hostfile="h", secure=True)


def test_nodes_sharing_a_context_share_one_zap_handler_until_the_last_stops():
    keys = generate_keys()
    ctx = zmq.Context()
    first, second = CurveSecurity(keys, "a"), CurveSecurity(keys, "b")
    try:
        first.start(ctx)
        second.start(ctx)  # a second handler could not bind ZeroMQ's one ZAP endpoint per context
        with pytest.raises(pskv.TransportError, match="another CURVE cluster key"):
            CurveSecurity(generate_keys()).start(ctx)
        first.stop()
        router = ctx.socket(zmq.ROUTER)
        second.server(router)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        dealer = ctx.socket(zmq.DEALER)
        second.client(dealer)
        dealer.connect(f"tcp://127.0.0.1:{port}")
        dealer.send(b"still admitted")
        assert router.poll(5000) and router.recv_multipart()[-1] == b"still admitted"
        dealer.close(0)
        router.close(0)
    finally:
        second.stop()
        ctx.term()  # returns: the handler's socket is closed


def test_an_in_process_cluster_with_a_key_pushes_and_pulls(tmp_path):
    key = write_key_file(tmp_path / "k", generate_keys())
    with InProcessCluster(2, 2, deadline=30.0, shm=0, curve_key_file=str(key)) as cluster:
        def work(cfg):
            kv = pskv.create("dist_sync", cluster=cfg)
            kv.init(0, np.zeros(5, np.float32))
            kv.push(0, np.full(5, kv.rank + 1.0, np.float32))
            out = kv.pull(0)
            kv.close()
            return out.tolist()

        assert cluster.run_workers(work) == [[3.0] * 5, [3.0] * 5]
        assert cluster.scheduler._runtime.security is not None


def test_without_a_running_zap_handler_no_peer_is_admitted():
    # ZAP_ENFORCE_DOMAIN: a CURVE server socket whose handler is not (yet) running admits
    # nobody, rather than any peer that knows its public key
    keys = generate_keys()
    sec = CurveSecurity(keys)
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    sec.server(router)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        for member in (True, False):
            dealer = ctx.socket(zmq.DEALER)
            dealer.linger = 0
            CurveSecurity(keys if member else generate_keys()).client(dealer)
            dealer.curve_serverkey = keys.public
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"hello")
            assert not router.poll(500)
            dealer.close(0)
    finally:
        router.close(0)
        ctx.term()


def test_refusals_are_logged_once_per_peer_and_interval_with_the_count(monkeypatch, caplog):
    import pskv.transport.security as security

    now = [100.0]
    monkeypatch.setattr(security.time, "monotonic", lambda: now[0])
    refusals = security.RefusalLog(logging.getLogger("pskv.test.refusals"), limit=2)
    with caplog.at_level("ERROR", logger="pskv.test.refusals"):
        for _ in range(50):
            refusals.error(b"peer a", "a refused")
        refusals.error(b"peer b", "b refused")
        now[0] += security.LOG_INTERVAL
        refusals.error(b"peer a", "a refused")
        refusals.error(b"peer c", "c refused")  # a third peer: the record keeps 2
    assert [r.getMessage() for r in caplog.records] == [
        "a refused", "b refused", f"a refused (49 more time(s) in the last {security.LOG_INTERVAL:g} s)", "c refused"]
    assert len(refusals._logged) == 2
