"""collc for torch.distributed.

``import collc`` registers the process-group backend ``collc``; then, under torchrun::

    dist.init_process_group("collc")
    dist.all_reduce(t)

runs torch's collectives through collc's verified schedules (the algorithm chosen per call size by collc's cost
model, or the ``.coll`` file ``collc.set_algorithm`` names). ``COLLC_DEBUG=INFO`` logs each call and the algorithm it
runs; ``COLLC_TRANSPORT`` (``shm``, ``tcp``) overrides the transport, which is ``shm`` when every rank of a group is on
one host and ``tcp`` otherwise.
"""

from ._collc import __version__
from .backend import ProcessGroupCollc, algorithm_of, register, set_algorithm

register()

__all__ = ["ProcessGroupCollc", "__version__", "algorithm_of", "register", "set_algorithm"]
