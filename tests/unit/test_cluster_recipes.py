"""The cluster recipes of examples/cluster/ (docs/clusters.md) name commands and variables that exist.

The PyTorchJob's pod script runs for real in
tests/integration/test_cluster_launchers.py; here: the manifests parse, their commands are
pskv's roles or files of this repository, their variables pskv's, and the sbatch script's
``pskv launch`` line parses with pskv's own arguments.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest

from pskv.cli import build_parser
from pskv.config import CLUSTER_ENV_VARS
from pskv.launch import add_arguments, config_from_args

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
CLUSTER = REPO / "examples" / "cluster"
IMAGE_ROOT = "/workspace/"  # where the manifests' image holds this repository's examples/
OWN_VARIABLES = {"POD_IP"}  # pytorchjob-pod.sh's


def containers(manifest: dict, specs: str) -> dict[str, dict]:
    return {role: spec["template"]["spec"]["containers"][0] for role, spec in manifest["spec"][specs].items()}


def check_command(command: list[str]) -> None:
    """A pskv role (the CLI parses it) or a file of this repository (after the image's root)."""
    if command[1:3] == ["-m", "pskv"]:
        build_parser().parse_args(command[3:])
        return
    for word in command:
        if word.startswith(IMAGE_ROOT):
            assert (REPO / word.removeprefix(IMAGE_ROOT)).is_file(), word


def check_env(container: dict) -> None:
    for item in container.get("env", []):
        assert item["name"] in CLUSTER_ENV_VARS or item["name"] in OWN_VARIABLES, item["name"]


def test_mxjob_manifest_runs_pskvs_roles_and_the_worker_program():
    manifest = yaml.safe_load((CLUSTER / "mxjob.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "MXJob")
    found = containers(manifest, "mxReplicaSpecs")
    assert sorted(found) == ["Scheduler", "Server", "Worker"]
    assert found["Scheduler"]["command"] == ["python", "-m", "pskv", "scheduler"]
    assert found["Server"]["command"] == ["python", "-m", "pskv", "server"]
    for container in found.values():
        assert container["name"] == "mxnet" and container["ports"][0]["name"] == "mxjob-port"  # the operator's names
        check_command(container["command"])
        check_env(container)


def test_pytorchjob_manifest_runs_every_pod_through_the_pod_script():
    manifest = yaml.safe_load((CLUSTER / "pytorchjob.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    found = containers(manifest, "pytorchReplicaSpecs")
    assert sorted(found) == ["Master", "Worker"]
    for container in found.values():
        assert container["name"] == "pytorch"  # the operator's name
        assert container["command"][:2] == ["sh", IMAGE_ROOT + "examples/cluster/pytorchjob-pod.sh"]
        check_command(container["command"])
        check_env(container)
        env = {item["name"]: item for item in container["env"]}
        assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert int(env["DMLC_NUM_SERVER"]["value"]) <= sum(spec["replicas"] for spec in
                                                           manifest["spec"]["pytorchReplicaSpecs"].values())


def test_sbatch_script_launches_as_many_workers_as_the_allocation_has_tasks():
    text = (CLUSTER / "sbatch.sh").read_text()
    sbatch = dict(line[len("#SBATCH --"):].split("=", 1) for line in text.splitlines() if line.startswith("#SBATCH --"))
    [line] = [line for line in text.splitlines() if line.startswith("pskv launch ")]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(shlex.split(line)[2:]))
    assert config.launcher == "slurm"
    assert config.num_workers == int(sbatch["nodes"]) * int(sbatch["ntasks-per-node"])
    assert config.num_servers == int(sbatch["nodes"])
    assert (REPO / config.command[1]).is_file()
