"""Process information and a few collectives, like deepspeed.comm.

Rank, world size and local rank come from the environment the job was launched with
(`tessera launch`, torchrun, SLURM, Open MPI; a single process when none is set) and need no
connection. barrier/all_reduce/broadcast use tessera's process groups (c10d Gloo, or NCCL with CUDA
tensors), created once per process: by tessera.initialize(), by init_distributed(), or lazily by the
first collective.

Do not also call torch.distributed.init_process_group with the same MASTER_PORT: tessera's rank 0
hosts its rendezvous store there.
"""
import signal
import threading

import torch

from . import _C

__all__ = [
    "get_rank", "get_world_size", "get_local_rank", "get_local_world_size", "is_initialized",
    "init_distributed", "barrier", "all_reduce", "broadcast", "describe",
]

_lock = threading.Lock()
_context = None  # _C.ParallelContext, one per process
_info = None     # the environment's rendezvous info, read once

_GROUPS = ("world", "data", "tensor", "pipe", "model")
_OPS = ("sum", "avg", "max", "min")


def _environment():
    global _info
    if _info is None:
        _info = _C.rendezvous_info()
    return _info


def get_rank():
    """This process's global rank (0 .. world size - 1)."""
    return _context.rank if _context is not None else _environment()["rank"]


def get_world_size():
    """The number of processes in the job."""
    return _context.world_size if _context is not None else _environment()["world_size"]


def get_local_rank():
    """This process's rank on its node (use it to pick a GPU)."""
    return _context.local_rank if _context is not None else _environment()["local_rank"]


def get_local_world_size():
    """The number of processes on this node."""
    return _context.local_world_size if _context is not None else _environment()["local_world_size"]


def is_initialized():
    """Whether this process has joined the job's process groups."""
    return _context is not None


def init_distributed(backend="auto", tensor_parallel=1, pipeline_stages=1):
    """Joins the job's process groups (every rank must call it); idempotent.

    backend: "auto" (NCCL when a GPU is visible, else Gloo), "gloo" or "nccl". tessera.initialize()
    calls it with the config's parallel degrees and "gloo" for a model on the CPU.
    """
    return _get_context(backend, tensor_parallel, pipeline_stages)


def _get_context(backend="auto", tensor=1, pipe=1):
    global _context
    if not isinstance(backend, str):
        raise TypeError("tessera.comm: backend must be a str ('auto', 'gloo' or 'nccl'), got %s" % type(backend).__name__)
    with _lock:
        if _context is None:
            _context = _while_sigint_kills(lambda: _C.ParallelContext(int(tensor), int(pipe), backend))
        elif (_context.tensor, _context.pipe) != (tensor, pipe) and (tensor, pipe) != (1, 1):
            raise ValueError(
                "tessera.comm: the process groups were created for tensor %d x pipe %d, the config asks for "
                "tensor %d x pipe %d; call tessera.initialize() before any other collective"
                % (_context.tensor, _context.pipe, tensor, pipe))
        elif backend not in ("auto", _context.backend):
            raise ValueError(
                "tessera.comm: the process groups already use %s, %s was asked for; call "
                "tessera.comm.init_distributed(backend=...) first" % (_context.backend, backend))
        return _context


def _while_sigint_kills(fn):
    """Runs fn (the rendezvous: it may wait minutes for the other ranks, in C++, where Python cannot
    raise KeyboardInterrupt) with SIGINT's default action, so Ctrl-C ends the process at once rather
    than after the wait. Only from the main thread, and only when SIGINT has Python's default handler."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return fn()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        return fn()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _group(group):
    if group not in _GROUPS:
        raise ValueError("tessera.comm: unknown group %r (expected one of %s)" % (group, ", ".join(_GROUPS)))
    return group


def barrier(group="world"):
    """Blocks until every rank of the group has called it."""
    _get_context().barrier(_group(group))


def all_reduce(tensor, op="sum", group="world"):
    """Reduces `tensor` in place across the group (op: "sum", "avg", "max", "min"); returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("tessera.comm.all_reduce: tensor must be a torch.Tensor, got %s" % type(tensor).__name__)
    if op not in _OPS:
        raise ValueError("tessera.comm.all_reduce: unknown op %r (expected one of %s)" % (op, ", ".join(_OPS)))
    _get_context().all_reduce(tensor, op, _group(group))
    return tensor


def broadcast(tensor, src=0, group="world"):
    """Copies `tensor` from group rank `src` to every rank of the group, in place; returns it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("tessera.comm.broadcast: tensor must be a torch.Tensor, got %s" % type(tensor).__name__)
    _get_context().broadcast(tensor, int(src), _group(group))
    return tensor


def describe():
    """"rank 1 of 2 (pipe 0, data 1, tensor 0) in pipe 1 x data 2 x tensor 1, gloo" once joined."""
    if _context is None:
        i = _environment()
        return "rank %d of %d (%s; process groups not created yet)" % (i["rank"], i["world_size"], i["source"])
    return _context.describe()
