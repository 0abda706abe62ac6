"""The helpers training scripts import from deepspeed.runtime.utils, under the same names:

    from tessera.runtime.utils import set_random_seed
"""
import random

import torch


def set_random_seed(seed):
    """Seeds Python's, NumPy's (when installed) and torch's generators, every device's included."""
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    from ..accelerator import get_accelerator
    get_accelerator().manual_seed_all(seed)
