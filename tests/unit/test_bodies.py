"""Every command body round-trips through encode/parse, and a malformed one is a ProtocolError naming the field."""

from __future__ import annotations

import pytest

from pskv.errors import ProtocolError
from pskv.protocol import Command, Header
from pskv.protocol import bodies as b

EXAMPLES = [
    (Command.REGISTER, b.Register("worker", "tcp://127.0.0.1:5", 1, b.ShmInfo("/dev/shm/x", "h1"))),
    (Command.REGISTER, b.Register("server", "tcp://127.0.0.1:6")),
    (Command.REPLY, b.NodeTable(9, 0, ("tcp://a:1", "tcp://b:2"), (b.ShmInfo("/d", "h"), None), 2, 3, True)),
    (Command.REPLY, b.Liveness((11,), {1: 0.5, 9: 2.0}, 3, ("tcp://a:1",), (None,))),
    (Command.REPLY, b.Liveness((), {})),
    (Command.REPLY, b.Liveness((), {9: 0.1}, left=(9, 11))),
    (Command.BARRIER, b.Barrier(6)),
    (Command.BARRIER, b.Barrier(4, "init", 3, 300.0, None, "", (("'w'", "shape (3,) dtype float32"),), "ab" * 32)),
    (Command.BARRIER, b.Barrier(4, "save_checkpoint", 5, 0.0, b.Failure("RemoteError", "no"), "/ckpt/ckpt-2")),
    (Command.BARRIER, b.Barrier(4, "save_optimizer_states", 2, 60.0, None, mode="read", nth=1)),
    (Command.REPLY, b.Met("/ckpt/ckpt-2", ((0, b.Failure("CheckpointError", "cannot create")),))),
    (Command.REPLY, b.Met()),
    (Command.SHUTDOWN, b.Shutdown(True)),
    (Command.HELLO, b.Hello("0123456789abcdef")),
    (Command.HELLO, b.Hello("0123456789abcdef", "ab" * 32)),
    (Command.HELLO, b.Hello("", "cd" * 32)),  # a local connection names no send-only socket
    (Command.REJOIN, b.Rejoin("ef" * 32)),
    (Command.REPLY, b.NodeTable(8, 0, ("tcp://a:1",), (None,), 1, 2, secret="01" * 32)),
    (Command.REPLY, b.NodeTable(9, 0, ("tcp://a:1",), (None,), 1, 2, token="23" * 32)),
    (Command.REPLY, b.Rejoined(((7, 0, 3), (-5, 1000, 0)))),
    (Command.SET_MODE, b.SetMode(False)),
    (Command.SET_OPTIMIZER, b.OptimizerConfig({"name": "sgd", "params": {"learning_rate": 0.1}})),
    (Command.CONTROLLER, b.ControllerCall(7, "go")),
    (Command.REPLY, b.ControllerAnswer("done")),
    (Command.SAVE_STATES, b.StatesRequest(True)),
    (Command.REPLY, b.OptimizerStates(3, ((7, 2, ()), (-5, 0, ())), {"name": "sgd", "params": {}})),
    (Command.LOAD_STATES, b.OptimizerStates(0, ())),
    (Command.SAVE_CHECKPOINT, b.CheckpointRequest("/ckpt/ckpt-1")),
    (Command.REPLY, b.CheckpointSaved("/ckpt/ckpt-1/server-0.safetensors", 123, 1)),
    (Command.ERROR, b.ErrorReply("NodeFailedError", "worker 1 died", "worker 1")),
]


@pytest.mark.parametrize(("command", "body"), EXAMPLES, ids=[f"{type(x).__name__}-{i}" for i, (_, x) in
                                                             enumerate(EXAMPLES)])
def test_each_body_round_trips(command, body):
    header = Header(command, 1, 9, body=body.encode())
    assert type(body).parse(header) == body


@pytest.mark.parametrize(("cls", "command", "text", "match"), [
    (b.Register, Command.REGISTER, '{"role": "admin", "address": ""}', "role must be server or worker"),
    (b.Register, Command.REGISTER, '{"role": "worker", "rank": "0"}', "field 'rank' must be int"),
    (b.Register, Command.REGISTER, '{"role": "worker", "rank": -7}', "rank -7 is not a rank"),
    (b.Register, Command.REGISTER, '{"role": "worker", "shm": {"dir": 1}}', "shm must be"),
    (b.NodeTable, Command.REPLY, '{"node_id": 9, "rank": 0, "servers": [1], "server_shm": [null]}',
     "must be a list of strings"),
    (b.Liveness, Command.REPLY, '{"dead": ["x"]}', "dead must be node ids"),
    (b.Liveness, Command.REPLY, '{"dead": [], "left": [1.5]}', "left too"),
    (b.Liveness, Command.REPLY, '{"ages": {"\u00b2": 1.0}}', "ages {node id: seconds}"),  # a Unicode digit
    (b.Liveness, Command.REPLY, '{"ages": {"' + "9" * 5000 + '": 1.0}}', "ages {node id: seconds}"),  # int() refuses
    (b.NodeTable, Command.REPLY, '{"node_id": 8, "rank": 0, "servers": ["tcp://a:1"], "server_shm": [null], '
     '"num_servers": 2, "num_workers": 1}', "num_servers 2 must be >= 1 and the servers listed"),
    (b.NodeTable, Command.REPLY, '{"node_id": 8, "rank": 0, "servers": [], "server_shm": [], "num_servers": 0, '
     '"num_workers": 1}', "num_servers 0 must be >= 1"),
    (b.NodeTable, Command.REPLY, '{"node_id": 8, "rank": 0, "servers": ["tcp://a:1"], "server_shm": [null], '
     '"num_servers": 1, "num_workers": -3}', "num_workers -3 >= 1"),
    (b.NodeTable, Command.REPLY, '{"node_id": 9, "rank": 0, "servers": ["tcp://a:1"], "server_shm": [null], '
     '"num_servers": 1, "num_workers": 1, "view": {"epoch": 2, "members": [0, 3], "commit": 0, "cause": "start"}}',
     "in an elastic job: the view's members"),
    (b.Barrier, Command.BARRIER, '{"group": 9}', "not a node group"),
    (b.Barrier, Command.BARRIER, '{"group": true}', "must be int"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "name": "' + "x" * 65 + '"}', "longer than 64"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "name": "barrier", "seq": -1}', "seq -1 is negative"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "failure": {"type": 1}}', "failure must be"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "agree": [["a"]]}', "agree must be at most"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "agree": [["a", "b"]], "digest": "ab"}' .replace(
        '[["a", "b"]]', str([["a", "b"]] * 257).replace("'", '"')), "agree must be at most 256"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "timeout": "1"}', "timeout must be a number"),
    (b.Barrier, Command.BARRIER, '{"group": 4, "name": "save", "mode": "post"}', "nth > 0"),
    (b.Met, Command.REPLY, '{"failed": [{"rank": "0"}]}', "failed must be"),
    (b.Hello, Command.HELLO, '{"tx": "XYZ"}', "16 lowercase hex"),
    (b.Hello, Command.HELLO, '{"token": "AB' + "0" * 62 + '"}', "'token' must be 64 lowercase hex"),
    (b.Hello, Command.HELLO, '{"token": "' + "0" * 65 + '"}', "'token' must be 64 lowercase hex"),
    (b.Rejoin, Command.REJOIN, '{"token": 7}', "'token' must be str"),
    (b.NodeTable, Command.REPLY, '{"node_id": 8, "rank": 0, "servers": [], "server_shm": [], "num_servers": 0, '
     '"num_workers": 1, "secret": "../x"}', "'secret' must be 64 lowercase hex"),
    (b.Rejoined, Command.REPLY, '{"counts": [[1, 0, -2]]}', "count >= 0"),
    (b.Rejoined, Command.REPLY, '{"counts": [[1, 0]]}', "triples"),
    (b.SetMode, Command.SET_MODE, "{}", "needs field 'sync'"),
    (b.SetMode, Command.SET_MODE, '{"sync": 1}', "must be bool"),
    (b.ControllerCall, Command.CONTROLLER, '{"head": 1.5}', "'head' must be int"),
    (b.StatesRequest, Command.SAVE_STATES, '{"path": "/etc/passwd"}', "SAVE_STATES names no file"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"path": "x", "num_update": 0, "keys": []}', "LOAD_STATES names no file"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": -1, "keys": []}', "num_update must be in"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [], "optimizer": "sgd"}', "an object or null"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [[1, 0, []], [1, 0, []]]}', "each key once"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [[1, -1, []]]}', "count >= 0"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [[1, 0, ["m", "m"]]]}', "distinct"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [[1, 0, ["m"]]]}', "one floating-point"),
    (b.OptimizerStates, Command.LOAD_STATES, '{"num_update": 0, "keys": [[1, 0, ' + str([f"s{i}" for i in range(17)])
     .replace("'", '"') + ']]}', "at most 16"),
    (b.CheckpointRequest, Command.SAVE_CHECKPOINT, '{"dir": ["a"]}', "'dir' must be str"),
    (b.SetMode, Command.SET_MODE, "[" * 100_000, "not JSON"),
    (b.SetMode, Command.SET_MODE, "[1]", "must be a JSON object"),
])
def test_a_malformed_body_names_the_command_and_field(cls, command, text, match):
    with pytest.raises(ProtocolError, match=match):
        cls.parse(Header(command, 1, 9, body=text))


def test_an_unreadable_error_body_still_becomes_an_error():
    got = b.ErrorReply.parse(Header(Command.ERROR, 1, 8, body="oops" * 100))
    assert got.type == "Error" and got.message == ("oops" * 100)[:200]


def test_a_failure_travels_bounded_and_keeps_a_servers_error_class():
    from pskv.errors import RemoteError

    failure = b.Failure.of(RemoteError("server 1", "OptimizerStateError", "x" * 10_000))
    assert failure.type == "OptimizerStateError" and len(failure.message) == b.MAX_TEXT
    assert b.Failure.of(ValueError("bad")) == b.Failure("ValueError", "bad")
    header = Header(Command.BARRIER, 1, 9, body=b.Barrier(4, "init", 2, failure=failure).encode())
    assert b.Barrier.parse(header).failure == failure


def test_a_token_is_the_hmac_of_the_node_id_under_the_jobs_secret():
    import hashlib
    import hmac

    secret = "5e" * 32
    assert b.node_token(secret, 9) == hmac.new(bytes.fromhex(secret), b"pskv-node-9", hashlib.sha256).hexdigest()
    assert len({b.node_token(secret, 9), b.node_token(secret, 11), b.node_token("5f" * 32, 9)}) == 3
    # bodies of older senders parse: no token is "" (a server then refuses the HELLO), no secret is ""
    assert b.Hello.parse(Header(Command.HELLO, 1, 9, body='{"tx": "0123456789abcdef"}')).token == ""
    assert b.Rejoin.parse(Header(Command.REJOIN, 1, 9)).token == ""


def test_optimizer_states_name_one_floating_point_array_of_their_key_per_state():
    from pskv.protocol import ArraySpec

    body = b.OptimizerStates(4, ((7, 2, ("mean", "var")), (9, 0, ())), None)
    specs = (ArraySpec(7, "float32", (3,)), ArraySpec(7, "bfloat16", (3,)))
    assert b.OptimizerStates.parse(Header(Command.LOAD_STATES, 1, 9, specs, body=body.encode())) == body
    for bad in ((ArraySpec(7, "float32", (3,)),),  # one array short
                (*specs, ArraySpec(9, "float32", (1,))),  # one too many
                (ArraySpec(8, "float32", (3,)), specs[1]),  # another key's
                (ArraySpec(7, "int64", (3,)), specs[1])):  # not a state's dtype
        with pytest.raises(ProtocolError, match="LOAD_STATES"):
            b.OptimizerStates.parse(Header(Command.LOAD_STATES, 1, 9, bad, body=body.encode()))
