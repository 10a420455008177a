"""pskv: a parameter server and key-value store for data-parallel training.

MXNet's KVStore API (``init / push / pull / pushpull / broadcast / row_sparse_pull``,
updaters and optimizers) over NumPy arrays and PyTorch tensors::

    import numpy as np, pskv
    kv = pskv.create("local")
    kv.init(3, np.ones((2, 3), np.float32))
    kv.push(3, [np.ones((2, 3), np.float32)] * 4)   # four devices' values are summed
    print(kv.pull(3))                                # [[4. 4. 4.] [4. 4. 4.]]

The public surface is re-exported here; implementation modules are layered
``errors, config -> arrays -> optimizer -> kvstore -> cli``.
"""

from pskv import optimizer
from pskv.config import Config
from pskv.errors import (
    CheckpointError,
    DTypeMismatchError,
    DuplicateKeyError,
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
from pskv.kvstore import KVStoreBase, LocalStore, OpHandle, create, known_types

__version__ = "0.1.0"

__all__ = [
    "CheckpointError",
    "Config",
    "DTypeMismatchError",
    "DuplicateKeyError",
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
    "ShapeMismatchError",
    "StoreClosedError",
    "TransportError",
    "UnknownKeyError",
    "UnsupportedValueError",
    "__version__",
    "create",
    "known_types",
    "optimizer",
]
