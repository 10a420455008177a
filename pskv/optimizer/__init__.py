"""MXNet-compatible optimizers for NumPy arrays and PyTorch tensors (no pickle anywhere).

Typical use::

    from pskv import optimizer as opt

    sgd = opt.create("sgd", learning_rate=0.1, momentum=0.9, wd=1e-4)
    updater = opt.get_updater(sgd)
    updater(3, grad, weight)          # weight updated in place, state kept per key
    updater.save_states("states.safetensors", dump_optimizer=True)

Optimizers travel as JSON configs: ``Optimizer.from_config(sgd.to_config())``.
"""

from pskv.optimizer.adagrad import AdaGrad
from pskv.optimizer.adam import Adam, AdamW
from pskv.optimizer.base import Key, Optimizer, State, register
from pskv.optimizer.ftrl import FTRL, Ftrl
from pskv.optimizer.lr_scheduler import (
    CosineScheduler,
    FactorScheduler,
    LRScheduler,
    MultiFactorScheduler,
    PolyScheduler,
)
from pskv.optimizer.registry import create, registered_names
from pskv.optimizer.rmsprop import RMSProp
from pskv.optimizer.sgd import NAG, SGD
from pskv.optimizer.updater import Updater, get_updater

__all__ = [
    "Key",
    "State",
    "Optimizer",
    "Updater",
    "create",
    "register",
    "registered_names",
    "get_updater",
    "SGD",
    "NAG",
    "Adam",
    "AdamW",
    "AdaGrad",
    "RMSProp",
    "Ftrl",
    "FTRL",
    "LRScheduler",
    "FactorScheduler",
    "MultiFactorScheduler",
    "PolyScheduler",
    "CosineScheduler",
]
