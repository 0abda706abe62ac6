"""deepspeed.runtime's names that training scripts import, under the same paths (tessera.runtime.utils,
tessera.runtime.config)."""
from . import config, utils  # noqa: F401  (reachable without importing them first)
