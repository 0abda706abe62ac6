"""deepspeed.runtime's names that training scripts import, under the same paths (tessera.runtime.utils)."""
from . import utils  # noqa: F401  (tessera.runtime.utils.set_random_seed without importing it first)
