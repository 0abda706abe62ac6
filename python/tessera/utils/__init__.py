"""The helpers training scripts import from deepspeed.utils, under the same names:

    from tessera.utils import RepeatingLoader, logger, log_dist   # was: from deepspeed.utils import ...
"""
import logging
import sys

import torch

logger = logging.getLogger("tessera")
if not logger.handlers:  # one handler, as DeepSpeed's logger has: "[date] [LEVEL] [file:line] message"
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d] %(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _rank():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    from .. import comm
    return comm.get_rank()


def log_dist(message, ranks=None, level=logging.INFO):
    """Logs `message` on the global ranks listed in `ranks` (None or [-1]: every rank), prefixed with
    the rank, as DeepSpeed's log_dist does."""
    rank = _rank()
    if ranks is None or -1 in ranks or rank in ranks:
        logger.log(level, "[Rank %d] %s" % (rank, message), stacklevel=2)  # the caller's file:line


class RepeatingLoader:
    """Wraps an iterable (a DataLoader) so that it never ends: at its end it starts again, and a
    sampler with set_epoch (DistributedSampler) is told the next epoch first, so each pass shuffles
    anew. Pipeline engines' train_batch(data_iter=iter(RepeatingLoader(loader))) reads it forever."""

    def __init__(self, loader):
        self.loader = loader
        self.epoch = 0
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.epoch += 1
            sampler = getattr(self.loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch)
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
