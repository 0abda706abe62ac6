"""tessera: a training engine for torch.nn.Module models, driven by a DeepSpeed-compatible config.

    import tessera
    engine, _, _, _ = tessera.initialize(model=model, config="configs/zero2_bf16.json")
    for batch in data:
        loss = engine(batch)          # the module's forward
        engine.backward(loss)         # loss / gradient_accumulation_steps (x fp16 loss scale), autograd
        engine.step()                 # the optimizer, at gradient-accumulation boundaries only

The engine itself is C++ (tessera._C, built by `pip install --no-build-isolation -e .`, which
`make python` runs); see docs/python.md.
"""
import torch  # loads libtorch*.so before the extension, which links them

try:
    from . import _C
except ImportError as e:  # not built, or built for another interpreter
    raise ImportError(
        "tessera: the C++ extension tessera._C could not be imported (%s). Install the package into this "
        "interpreter's environment: `make python` for the project venv, or `pip install --no-build-isolation "
        "-e .` from the checkout with this interpreter. See docs/python.md." % e) from e

if _C.torch_version != torch.__version__:
    raise ImportError(
        "tessera: tessera._C was built against torch %s but this interpreter has torch %s; rebuild it "
        "with `make python` (or `pip install --no-build-isolation -e .`) using this interpreter." % (_C.torch_version, torch.__version__))

ConfigError = _C.ConfigError
ConfigError.__module__ = "tessera"
ConfigError.__doc__ = "An invalid config: the message lists every error, each with its JSON path (a ValueError)."
RendezvousError = _C.RendezvousError
RendezvousError.__module__ = "tessera"
CommError = _C.CommError
CommError.__module__ = "tessera"

from . import comm  # noqa: E402
from . import zero  # noqa: E402
from . import tensor_parallel  # noqa: E402
from . import checkpointing  # noqa: E402
from . import nn  # noqa: E402
from .engine import Engine  # noqa: E402
from .initialization import initialize, resolve_auto_layout  # noqa: E402
from .comm import init_distributed  # noqa: E402  (DeepSpeed's deepspeed.init_distributed)


def add_config_arguments(parser):
    """DeepSpeed's add_config_arguments: adds --deepspeed (a flag), --deepspeed_config FILE and its
    alias --tessera_config FILE to an argparse parser; initialize(args=...) reads the config from
    args.deepspeed_config (or args.tessera_config). Returns the parser."""
    group = parser.add_argument_group("tessera", "tessera (DeepSpeed-compatible) configuration")
    group.add_argument("--deepspeed", default=False, action="store_true",
                       help="train with tessera (accepted for DeepSpeed scripts; tessera always runs)")
    group.add_argument("--deepspeed_config", "--tessera_config", dest="deepspeed_config", default=None, type=str,
                       help="the DeepSpeed-style JSON config file")
    return parser



def estimate(**request):
    """Memory per GPU, per node's CPU and NVMe for a training setup, like `tessera estimate`.

    Keys are the CLI's flags with underscores: tessera.estimate(preset="llama-7b", zero=2, bf16=True,
    gpus_per_node=8, gpu_mem=80). Returns the `--json` answer as a dict (fits, per_gpu, per_node_cpu,
    per_node_nvme, options, ...); invalid requests raise ValueError naming the key.
    """
    import json

    return json.loads(_C.estimate_json(json.dumps(request)))


def plan(top=5, **request):
    """The layouts that fit, ranked by predicted step time, like `tessera plan --json`.

    Keys are the CLI's flags with underscores: tessera.plan(preset="gpt2-medium", global_batch=64,
    gpus_per_node=8, bf16=True). A layout key (zero, tp, pp, cp, micro_batch, offload_optimizer,
    offload_param, activation_checkpointing) fixes that choice. Returns a dict: "ranked" (each with
    its layout, predicted step time, terms and, for the first `top`, its config), "rejected" with
    reasons, "calibration" with where each rate came from, and "best" (the first config).
    """
    import json

    return json.loads(_C.plan_json(json.dumps(request), top))


# Names of DeepSpeed's top-level module that scripts use and tessera does not have: reading one says
# so (a module-level __getattr__ only runs for names the module lacks).
_DEEPSPEED_MODULE_NAMES = frozenset({
    "init_inference", "InferenceEngine", "DeepSpeedEngine", "DeepSpeedConfig", "DeepSpeedOptimizer",
    "DeepSpeedHybridEngine", "DeepSpeedTransformerLayer", "DeepSpeedTransformerConfig", "ops",
    "profiling", "compression", "inference", "autotuning", "elasticity", "launcher",
    "module_inject", "env_report", "git_version_info", "is_compile_supported", "tp_model_init",
    "add_tuning_arguments", "default_inference_config", "replace_transformer_layer", "revert_transformer_layer",
})
# Imported on first use: pipe pulls in more than most scripts need; accelerator, utils and runtime
# are DeepSpeed's helpers under their DeepSpeed names (deepspeed.utils.RepeatingLoader, ...).
_SUBMODULES = frozenset({"pipe", "monitor", "plot", "accelerator", "utils", "runtime", "moe", "sequence"})


def __getattr__(name):
    if name == "get_accelerator":  # `from deepspeed import get_accelerator`
        from .accelerator import get_accelerator
        return get_accelerator
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module("." + name, __name__)
    if name in _DEEPSPEED_MODULE_NAMES:
        raise AttributeError("module 'tessera' has no attribute %r: DeepSpeed has deepspeed.%s, tessera does not "
                             "implement it (docs/python.md lists what tessera has)" % (name, name))
    raise AttributeError("module 'tessera' has no attribute %r" % name)


__all__ = ["initialize", "init_distributed", "add_config_arguments", "Engine", "ConfigError", "RendezvousError", "CommError", "comm", "zero", "tensor_parallel", "nn", "checkpointing",
           "estimate"]
__version__ = "0.1.0"
