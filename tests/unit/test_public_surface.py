"""The public surface declared at the top of pskv/__init__.py imports from where it says."""

from __future__ import annotations

import importlib

import pytest

import pskv

SURFACE = {
    "pskv": ["create", "known_types", "KVStoreBase", "LocalStore", "StoreType", "OpHandle", "Config",
             "KVStoreError", "NodeFailedError", "RemoteError", "optimizer", "RowSparse"],
    "pskv.optimizer": ["Optimizer", "SGD", "Adam", "FactorScheduler", "Updater", "create", "register"],
    "pskv.parallel": ["DataParallelExecutorGroup", "Trainer", "fit", "NDArrayIter", "save_checkpoint",
                      "load_checkpoint", "metrics", "Monitor"],
    "pskv.server": ["controller"],
    "pskv.testing": ["InProcessCluster", "fuzz"],
    "pskv.checkpoints": ["latest_server_checkpoint", "latest_training_checkpoint", "read_manifest"],
}


@pytest.mark.parametrize("namespace", sorted(SURFACE))
def test_each_public_name_imports_from_its_namespace_and_is_exported(namespace):
    module = importlib.import_module(namespace)
    for name in SURFACE[namespace]:
        assert getattr(module, name) is not None
        assert name in module.__all__, f"{namespace}.{name} is public but not in __all__"


def test_the_table_in_the_package_docstring_names_every_public_namespace():
    doc = pskv.__doc__ or ""
    for namespace in SURFACE:
        assert f"``{namespace}``" in doc


def test_every_error_class_is_exported_at_the_top():
    from pskv import errors

    for name in errors.__all__:
        assert getattr(pskv, name) is getattr(errors, name)
