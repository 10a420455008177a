"""BytePS's ``byteps.torch.parallel``: its ``DistributedDataParallel`` is :class:`pskv.torch.ddp.DistributedDataParallel`.

So ``from byteps.torch.parallel import DistributedDataParallel`` becomes
``from pskv.torch.parallel import DistributedDataParallel``, a change of the package name only.
"""

from pskv.torch.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
