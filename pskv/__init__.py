"""pskv: a parameter server and key-value store for data-parallel training.

MXNet's KVStore API (``init / push / pull / pushpull / broadcast / row_sparse_pull``,
updaters and optimizers) over NumPy arrays and PyTorch tensors::

    import numpy as np, pskv
    kv = pskv.create("local")
    kv.init(3, np.ones((2, 3), np.float32))
    kv.push(3, [np.ones((2, 3), np.float32)] * 4)   # four devices' values are summed
    print(kv.pull(3))                                # [[4. 4. 4.] [4. 4. 4.]]

Public surface — what users import (everything else is an implementation module whose
names may change; ``tests/unit/test_public_surface.py`` checks this table):

=========================  ==============================================================
``pskv``                   ``create``, ``known_types``, the store classes
                           (``KVStoreBase``, ``LocalStore``, ``StoreType``, ``OpHandle``),
                           ``Config``, every error class, ``optimizer``,
                           ``RowSparse`` (a row-sparse value), ``TableInit`` (a table
                           drawn on the servers)
``pskv.optimizer``         optimizers, learning-rate schedulers, ``Updater``, ``create``,
                           ``register``
``pskv.parallel``          ``DataParallelExecutorGroup``, ``Trainer``, ``fit``, data
                           iterators, checkpoints, ``metrics``, ``Monitor``
``pskv.server``            ``controller`` (functions answering ``send_command_to_servers``)
``pskv.testing``           ``InProcessCluster``, ``fuzz``
``pskv.checkpoints``       the checkpoint directory layout (``latest_server_checkpoint``, ...)
``pskv`` command           ``pskv launch / info / checkpoint / keygen / server / scheduler``
=========================  ==============================================================

The layers below (imports point down only; ``docs/architecture.md`` has the map):
``cli > launch > testing > parallel > kvstore > roles > server | worker > cluster >
optimizer > transport > protocol > arrays > checkpoints > atomic | partition > config |
_registry > errors``.
"""

from pskv import optimizer
from pskv.arrays.rowsparse import RowSparse
from pskv.arrays.tables import TableInit
from pskv.config import Config
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
from pskv.kvstore import KVStoreBase, LocalStore, OpHandle, StoreType, create, known_types

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "CollectiveFailedError",
    "CollectiveMismatchError",
    "Config",
    "DTypeMismatchError",
    "DuplicateKeyError",
    "InitMismatchError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "KVStoreBase",
    "KVStoreError",
    "KeyTypeError",
    "LaunchError",
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
    "__version__",
    "create",
    "known_types",
    "optimizer",
]
