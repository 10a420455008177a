"""pskv: a parameter server and key-value store for data-parallel training.

MXNet's KVStore API (``init / push / pull / pushpull / broadcast / row_sparse_pull``,
updaters and optimizers) over NumPy arrays and PyTorch tensors::

    import numpy as np, pskv
    kv = pskv.create("local")
    kv.init(3, np.ones((2, 3), np.float32))
    kv.push(3, [np.ones((2, 3), np.float32)] * 4)   # four devices' values are summed
    print(kv.pull(3))                                # [[4. 4. 4.] [4. 4. 4.]]

Public surface — what users import (everything else is an implementation module whose
names may change). This table is the one declaration: ``docs/api`` documents exactly
these namespaces, and ``tests/unit/test_public_surface.py`` checks the names, the pages of
``docs/api`` and ``mkdocs.yml`` against it:

=========================  ==============================================================
``pskv``                   ``create``, ``known_types``, the store classes
                           (``KVStoreBase``, ``LocalStore``, ``DistStore``,
                           ``BytePSStore``, ``AllreduceStore``, ``StoreType``,
                           ``OpHandle``), ``Config``, ``ClusterConfig``, every error
                           class, ``optimizer``, ``RowSparse`` (a row-sparse value),
                           ``TableInit`` (a table drawn on the servers)
``pskv.optimizer``         optimizers, learning-rate schedulers, ``Updater``, ``create``,
                           ``register``
``pskv.compression``       gradient compressors (``Compressor``, ``TwoBit``, ...),
                           ``create``, ``register``, ``Residuals``
``pskv.parallel``          ``DataParallelExecutorGroup``, ``Trainer``, ``fit``, data
                           iterators, checkpoints, ``metrics``, ``Monitor``
``pskv.metrics``           a job's metrics through its scheduler: ``snapshot``,
                           ``MetricsClient``, ``JobMetrics``, ``NodeMetrics``
``pskv.timeline``          timeline files: ``load``, ``merge``, ``summary``
``pskv.errors``            every error pskv raises, each also exported at the top
                           (pskv.WorkerDrained, a SystemExit with code 0, is no error: top only)
``pskv.server``            ``controller`` (functions answering
                           ``kv.send_command_to_servers``)
``pskv.testing``           ``InProcessCluster``, ``fuzz``
``pskv.checkpoints``       the checkpoint directory layout (``latest_server_checkpoint``,
                           ``latest_training_checkpoint``, ``read_manifest``)
``pskv`` command           ``pskv launch / info / checkpoint / keygen / server /
                           scheduler / top / timeline``
=========================  ==============================================================

The layers (imports point down only) are listed once, in ``pyproject.toml``'s
``[tool.importlinter]``, which ``lint-imports`` enforces; ``docs/architecture.md`` has the map.
"""

from pskv import optimizer
from pskv.arrays.rowsparse import RowSparse
from pskv.arrays.tables import TableInit
from pskv.config import ClusterConfig, Config
from pskv.errors import (
    CheckpointError,
    CollectiveFailedError,
    CollectiveMismatchError,
    DTypeMismatchError,
    DuplicateKeyError,
    InitMismatchError,
    InvalidArgumentError,
    InvalidTypeError,
    KeyTypeError,
    KVStoreError,
    LaunchError,
    MembershipChangedError,
    NodeFailedError,
    NotSupportedError,
    OperationTimeoutError,
    OptimizerStateError,
    ProtocolError,
    RemoteError,
    ShapeMismatchError,
    StoreClosedError,
    TransportError,
    UnknownKeyError,
    UnsupportedValueError,
)
from pskv.kvstore import (
    AllreduceStore,
    BytePSStore,
    DistStore,
    KVStoreBase,
    LocalStore,
    OpHandle,
    StoreType,
    create,
    known_types,
)
from pskv.kvstore.elastic import WorkerDrained

__version__ = "0.1.0"

__all__ = [
    "AllreduceStore",
    "BytePSStore",
    "CheckpointError",
    "ClusterConfig",
    "CollectiveFailedError",
    "CollectiveMismatchError",
    "Config",
    "DTypeMismatchError",
    "DistStore",
    "DuplicateKeyError",
    "InitMismatchError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KVStoreBase",
    "KVStoreError",
    "KeyTypeError",
    "LaunchError",
    "MembershipChangedError",
    "NodeFailedError",
    "LocalStore",
    "NotSupportedError",
    "OpHandle",
    "OperationTimeoutError",
    "OptimizerStateError",
    "ProtocolError",
    "RemoteError",
    "RowSparse",
    "TableInit",
    "ShapeMismatchError",
    "StoreClosedError",
    "StoreType",
    "TransportError",
    "UnknownKeyError",
    "UnsupportedValueError",
    "WorkerDrained",
    "__version__",
    "create",
    "known_types",
    "optimizer",
]
