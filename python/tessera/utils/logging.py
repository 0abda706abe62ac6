"""deepspeed.utils.logging's names: the library's logger (tessera.utils.logger) and log_dist."""
from . import log_dist, logger  # noqa: F401
