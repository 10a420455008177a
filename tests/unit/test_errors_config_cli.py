"""The errors module's hierarchy, the config module's environment parsing, and the CLI."""

from __future__ import annotations

import json

import pytest

import pskv
from pskv import errors
from pskv.cli import main
from pskv.config import ENV_VARS, Config

BUILTIN_OF = {
    errors.UnknownKeyError: KeyError,
    errors.DuplicateKeyError: KeyError,
    errors.ShapeMismatchError: ValueError,
    errors.DTypeMismatchError: ValueError,
    errors.InvalidArgumentError: ValueError,
    errors.OptimizerStateError: ValueError,
    errors.CheckpointError: ValueError,
    errors.InvalidTypeError: TypeError,
    errors.KeyTypeError: TypeError,
    errors.UnsupportedValueError: TypeError,
    errors.OperationTimeoutError: TimeoutError,
    errors.StoreClosedError: RuntimeError,
    errors.NotSupportedError: NotImplementedError,
    errors.ProtocolError: ValueError,
    errors.TransportError: ConnectionError,
    errors.NodeFailedError: ConnectionError,
    errors.RemoteError: RuntimeError,
    errors.LaunchError: RuntimeError,
    errors.CollectiveMismatchError: RuntimeError,
    errors.CollectiveFailedError: RuntimeError,
    errors.InitMismatchError: ValueError,
    errors.MembershipChangedError: ConnectionError,
}


def test_every_error_has_the_root_and_its_builtin():
    assert set(BUILTIN_OF) == {getattr(errors, n) for n in errors.__all__} - {errors.KVStoreError}
    for cls, builtin in BUILTIN_OF.items():
        assert issubclass(cls, errors.KVStoreError) and issubclass(cls, builtin), cls
        assert getattr(pskv, cls.__name__) is cls


def test_key_errors_print_plain_messages():
    e = errors.UnknownKeyError("w", "pull")
    assert str(e) == "key 'w' has not been initialised; call init('w', value) or broadcast before pull"
    assert e.key == "w"


def test_config_defaults_env_and_overrides():
    assert Config.from_env({}) == Config()
    cfg = Config.from_env({"PSKV_KERNEL_THREADS": "3", "PSKV_DEFAULT_TIMEOUT": "1.5"}, engine_threads=4)
    assert (cfg.kernel_threads, cfg.default_timeout, cfg.engine_threads) == (3, 1.5, 4)
    assert Config.from_env({"PSKV_ENGINE_THREADS": ""}).engine_threads == Config().engine_threads


@pytest.mark.parametrize("env,match", [
    ({"PSKV_KERNEL_THREADS": "many"}, "PSKV_KERNEL_THREADS='many' is not a valid int"),
    ({"PSKV_ENGINE_THREADS": "0"}, "^environment variable PSKV_ENGINE_THREADS='0': engine_threads must be >= 1"),
    ({"PSKV_DEFAULT_TIMEOUT": "-1"}, "^environment variable PSKV_DEFAULT_TIMEOUT='-1': default_timeout must be > 0"),
])
def test_config_rejects_bad_values(env, match):
    with pytest.raises(pskv.InvalidArgumentError, match=match):
        Config.from_env(env)


def test_a_bad_cluster_setting_names_its_variable_and_an_override_its_setting():
    from pskv.config import ClusterConfig
    with pytest.raises(pskv.InvalidArgumentError,
                       match="^environment variable PS_HEARTBEAT_TIMEOUT='-3': heartbeat_timeout must be >= 0"):
        ClusterConfig.from_env({"PS_HEARTBEAT_TIMEOUT": "-3"})
    with pytest.raises(pskv.InvalidArgumentError, match="^heartbeat_timeout must be >= 0"):  # passed in code
        ClusterConfig.from_env({"PS_HEARTBEAT_TIMEOUT": "5"}, heartbeat_timeout=-3.0)


def test_every_env_var_is_documented():
    with open("docs/env.md", encoding="utf-8") as f:
        text = f.read()
    for var in ENV_VARS:
        assert f"`{var}`" in text, var


def test_create_passes_settings_to_the_store(make_store):
    kv = make_store("local", engine_threads=3, default_timeout=7)
    assert kv._config.engine_threads == 3 and kv._config.default_timeout == 7


def test_cli_info_json(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["pskv"] == pskv.__version__
    assert "local" in info["store_types"] and "device" in info["store_types"]
    assert set(info["settings"]) == set(ENV_VARS)


def test_cli_info_with_a_bad_setting_and_the_roles_help(capsys, monkeypatch):
    monkeypatch.setenv("PSKV_ENGINE_THREADS", "0")
    assert main(["info"]) == 2
    assert capsys.readouterr().err == ("pskv info: error: environment variable PSKV_ENGINE_THREADS='0': "
                                       "engine_threads must be >= 1, got 0\n")
    for role, has_port_file in (("scheduler", True), ("server", False)):  # only the scheduler writes a port file
        with pytest.raises(SystemExit):
            main([role, "--help"])
        assert ("--port-file" in capsys.readouterr().out) == has_port_file, role
    with pytest.raises(SystemExit):
        main(["top", "--help"])
    assert "a bare port means 127.0.0.1" in " ".join(capsys.readouterr().out.split())


def test_cli_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert pskv.__version__ in capsys.readouterr().out


def test_bind_host_precedence():
    from pskv.config import ClusterConfig
    from pskv.transport.addresses import bind_host, interface_address

    assert bind_host(ClusterConfig()) == "127.0.0.1"
    assert bind_host(ClusterConfig(node_host="10.1.2.3", interface="lo")) == "10.1.2.3"
    assert bind_host(ClusterConfig(interface="lo")) == "127.0.0.1"
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(pskv.InvalidArgumentError, match="DMLC_INTERFACE='nosuch0'.*interfaces here: .*lo"):
        interface_address("nosuch0")


def test_every_cluster_variable_is_documented():
    from pskv.config import CLUSTER_ENV_VARS

    with open("docs/env.md", encoding="utf-8") as f:
        text = f.read()
    for var in CLUSTER_ENV_VARS:
        assert f"`{var}`" in text, var


def test_local_rank_takes_bytepss_name_when_pskv_s_is_unset():
    from pskv.config import ClusterConfig

    assert ClusterConfig.from_env({"BYTEPS_LOCAL_RANK": "3"}).local_rank == 3
    assert ClusterConfig.from_env({"BYTEPS_LOCAL_RANK": "3", "PSKV_LOCAL_RANK": "1"}).local_rank == 1


def test_a_bad_local_rank_names_the_variable_that_gave_it():
    from pskv.config import ClusterConfig

    for env, var in (({"BYTEPS_LOCAL_RANK": "-5"}, "BYTEPS_LOCAL_RANK"), ({"PSKV_LOCAL_RANK": "-5"}, "PSKV_LOCAL_RANK"),
                     ({"BYTEPS_LOCAL_RANK": "3", "PSKV_LOCAL_RANK": "-5"}, "PSKV_LOCAL_RANK")):
        with pytest.raises(errors.InvalidArgumentError, match=f"environment variable {var}='-5': local_rank must be >= 0"):
            ClusterConfig.from_env(env)
