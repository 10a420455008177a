"""Nothing loaded is trusted (issue 28, finding 4): every JSON a process reads from a file is parsed
within a size and a nesting bound (``pskv.safefile.parse_json``), a damaged checkpoint is skipped by
the launcher's scan with a one-line note, a server checkpoint's row-sparse rows are checked without
int64 wrap, and an optimizer state that does not fit is refused before anything changes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import pskv
from pskv.checkpoints import MANIFEST, latest_server_checkpoint, read_manifest, restart_checkpoint, write_manifest
from pskv.errors import CheckpointError, OptimizerStateError
from pskv.optimizer import SGD
from pskv.optimizer import states as state_format
from pskv.safefile import parse_json, read_document, read_header, read_json, write_document, write_tensors
from pskv.server.snapshot import PartState, ShardState, read_shard, write_shard
from pskv.testing.loopback import loopback_store

DEEP = "[" * 100_000 + "]" * 100_000  # kills json.loads with RecursionError


def test_json_is_parsed_within_a_depth_and_a_size_bound(tmp_path):
    assert parse_json('{"a": [1, {"b": "[[[["}]}', "x") == {"a": [1, {"b": "[[[["}]}
    with pytest.raises(CheckpointError, match=r"^the doc nests deeper than 64 levels"):
        parse_json(DEEP, "the doc")
    with pytest.raises(CheckpointError, match=r"nests deeper than 64 levels"):
        parse_json("[" * 100 + "]" * 100, "the doc")  # parses, but deeper than pskv's bound
    with pytest.raises(OptimizerStateError, match=r"^the doc is too large \(11 bytes of JSON; at most 10\)"):
        parse_json('"123456789"', "the doc", OptimizerStateError, max_bytes=10)
    with pytest.raises(CheckpointError, match=r"^the doc is not JSON"):
        parse_json("{", "the doc")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(list(range(100))))
    with pytest.raises(CheckpointError, match=r"big\.json is too large"):
        read_json(big, max_bytes=100)
    (tmp_path / "deep.json").write_text(DEEP)
    with pytest.raises(CheckpointError, match=r"deep\.json nests deeper"):
        read_json(tmp_path / "deep.json")


def test_a_deep_manifest_or_safetensors_metadata_is_a_checkpoint_error_naming_the_file(tmp_path):
    (tmp_path / MANIFEST).write_text(DEEP)
    with pytest.raises(CheckpointError, match=r"manifest\.json nests deeper"):
        read_manifest(tmp_path)
    path = tmp_path / "server-0.safetensors"
    write_tensors(path, {"x": np.zeros(2, np.float32)}, {"pskv": DEEP})
    with pytest.raises(CheckpointError, match=r"server-0\.safetensors is not a pskv file: the 'pskv' metadata nests"):
        read_document(path, "f", 1)
    header = json.dumps({"__metadata__": {}}).encode()[:-1] + b', "x": ' + DEEP.encode() + b"}"
    (tmp_path / "raw.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(CheckpointError, match=r"raw\.safetensors is not a safetensors file"):
        read_header(tmp_path / "raw.safetensors")
    write_document(tmp_path / "ok.safetensors", "f", 1, {"a": [1]}, {"x": np.zeros(2, np.float32)})
    assert read_document(tmp_path / "ok.safetensors", "f", 1)[0]["a"] == [1]


def _checkpoint(root, n, manifest=None):
    d = root / f"ckpt-{n}"
    write_shard(d, ShardState(0, 1, 1, True, (PartState(3, 0, "float32", np.ones(4, np.float32), 2),), None))
    write_manifest(d, {"num_servers": 1, "num_workers": 1})
    if manifest is not None:
        (d / MANIFEST).write_text(manifest)
    return d


def test_the_restart_scan_skips_a_damaged_newest_checkpoint_with_a_note(tmp_path):
    good = _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2, manifest=DEEP)
    _checkpoint(tmp_path, 3, manifest='{"format": "pskv.server-checkpoint", "num_servers": 2}')
    for n, cut in ((4, lambda data: data[: len(data) // 2]), (5, lambda data: data[:-8])):  # a shard cut short
        shard = _checkpoint(tmp_path, n) / "server-0.safetensors"
        shard.write_bytes(cut(shard.read_bytes()))
    notes: list[str] = []
    assert restart_checkpoint(tmp_path, notes.append) == good
    assert latest_server_checkpoint(tmp_path) == good
    assert len(notes) == 4 and all("\n" not in n for n in notes)
    for note, n in zip(notes[:2], (5, 4)):
        assert note.startswith(f"skipping damaged checkpoint {tmp_path / f'ckpt-{n}'}: ") and "server-0" in note, note
    assert notes[2].startswith(f"skipping damaged checkpoint {tmp_path / 'ckpt-3'}: ") and "server-1" in notes[2]
    assert notes[3].startswith(f"skipping damaged checkpoint {tmp_path / 'ckpt-2'}: ") and "nests deeper" in notes[3]


def test_the_restart_scan_fails_with_one_line_when_every_checkpoint_is_damaged(tmp_path):
    assert restart_checkpoint(tmp_path, print) is None  # no checkpoint at all: start from the beginning
    _checkpoint(tmp_path, 1, manifest=DEEP)
    notes: list[str] = []
    with pytest.raises(CheckpointError, match=r"^no usable checkpoint in .*: every one is damaged$"):
        restart_checkpoint(tmp_path, notes.append)
    assert len(notes) == 1 and "ckpt-1" in notes[0]


@pytest.mark.parametrize("present", [[0, 2**63 - 1, -(2**63)], [1, 0], [0, 3], [-1, 0], [1, 1]])
def test_a_checkpoint_s_row_sparse_rows_are_checked_without_wrap(tmp_path, present):
    part = PartState(7, 0, "float32", np.zeros(6, np.float32), 1, True, {}, 2, np.array(present, np.int64))
    write_shard(tmp_path, ShardState(0, 1, 1, True, (part,), None))
    with pytest.raises(CheckpointError, match=r"server-0\.safetensors: the row-sparse part of key 7 offset 0 is "
                                              r"damaged .*present rows do not fit"):
        read_shard(tmp_path, 0)


def test_a_checkpoint_part_of_the_wrong_dtype_or_shape_is_refused(tmp_path):
    for value in (np.zeros(4, np.float64), np.zeros((2, 2), np.float32)):
        write_shard(tmp_path, ShardState(0, 1, 1, True, (PartState(7, 0, "float32", value, 1),), None))
        with pytest.raises(CheckpointError, match=r"server-0\.safetensors: key 7 offset 0 holds .* not a flat "
                                                  r"float32 value"):
            read_shard(tmp_path, 0)


def test_an_optimizer_state_file_nesting_deep_is_an_optimizer_state_error(tmp_path):
    write_tensors(tmp_path / "deep.server0", {}, {"format": state_format.FORMAT_NAME,
                                                  "version": str(state_format.FORMAT_VERSION), "states": DEEP})
    with pytest.raises(OptimizerStateError, match=r"the 'states' metadata nests deeper"):
        state_format.load(tmp_path / "deep.server0")
    with loopback_store("dist_sync", num_servers=1) as kv:
        kv.init(5, np.zeros(4, np.float32))
        with pytest.raises(OptimizerStateError, match=r"nests deeper"):
            kv.load_optimizer_states(str(tmp_path / "deep"))


def test_a_refused_optimizer_state_leaves_the_key_working(tmp_path):
    with loopback_store("dist_sync", num_servers=1) as kv, loopback_store("dist_sync", num_servers=1) as other:
        kv.init(5, np.zeros(4, np.float32))
        kv.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        kv.push(5, np.ones(4, np.float32))
        kv.save_optimizer_states(str(tmp_path / "four"))
        other.init(5, np.zeros(3, np.float32))
        other.set_optimizer(SGD(learning_rate=0.1, momentum=0.9))
        with pytest.raises(pskv.RemoteError, match=r"has shape \(4,\), the key's slice on this server \(3,\)"):
            other.load_optimizer_states(str(tmp_path / "four"))
        other.push(5, np.ones(3, np.float32))  # the next push is applied with the old (empty) state
        np.testing.assert_allclose(other.pull(5), np.full(3, -0.1, np.float32), rtol=1e-6)
