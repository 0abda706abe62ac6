"""What every module that takes a config needs, below them all (no imports of tessera's own):
a config given as a path, JSON text or a dict turned into what the C++ parser takes, or into a dict,
and how errors name a value's type."""
import collections.abc
import json
import os


def type_name(x):
    """A value's type as errors name it: "int", or "module.Qualified" outside the builtins."""
    return type(x).__module__ + "." + type(x).__qualname__ if type(x).__module__ != "builtins" else type(x).__name__


def config_text(config, who="tessera.initialize"):
    """A path, JSON text or a dict -> what _C.load_config takes (a path, or text starting with '{')."""
    if isinstance(config, collections.abc.Mapping):
        try:
            return json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError("%s: the config dict is not JSON-serializable: %s" % (who, e)) from None
    if isinstance(config, os.PathLike):
        return os.fspath(config)
    if isinstance(config, str):
        if config.lstrip().startswith("{"):
            return config.lstrip()
        return config
    raise TypeError("%s: config must be a path (str or os.PathLike), JSON text or a dict, got %s"
                    % (who, type_name(config)))


def config_dict(config, who="tessera.initialize"):
    """A path, JSON text or a dict -> a new dict (to add the client optimizer's section to)."""
    if isinstance(config, collections.abc.Mapping):
        return json.loads(config_text(config, who))
    text = config_text(config, who)
    if not text.startswith("{"):
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise ValueError("%s: cannot read config file '%s': %s" % (who, text, e.strerror)) from None
    return json.loads(text)
