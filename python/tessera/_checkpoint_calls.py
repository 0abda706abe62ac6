"""The checkpoint calls of both engines (tessera.Engine and tessera.pipe.PipelineEngine), DeepSpeed's
save_checkpoint / load_checkpoint / save_16bit_model over the C++ engine (docs/checkpoints.md)."""
import collections.abc
import json
import os

from . import comm

# A client LR scheduler (tessera/client.py) and the param groups' learning rates are Python state:
# saved in the metadata's client_state under this key, taken out again by the load.
_CLIENT_LR_KEY = "__tessera_client_lr__"


def _type_name(x):
    return type(x).__name__


def hf_config(module):
    """A transformers model's config as a dict (what its save_pretrained writes as config.json), or
    None for any other module."""
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_dict") or not hasattr(config, "model_type"):
        return None
    d = json.loads(config.to_json_string(use_diff=False)) if hasattr(config, "to_json_string") else dict(config.to_dict())
    if not d.get("architectures"):
        d["architectures"] = [type(module).__name__]  # save_pretrained records the class from_pretrained builds
    return d


class CheckpointCalls:
    """Mixed into an engine class whose `_c` is the C++ engine handle."""

    def save_checkpoint(self, save_dir, tag=None, client_state=None, async_save=None):
        """Saves the training state under save_dir/tag (default tag "global_step<N>") and names it in
        save_dir/latest, as DeepSpeed's save_checkpoint; every rank calls it. Each rank writes its
        shard (weights, optimizer state, RNG) as safetensors; client_state, a JSON-serializable dict
        (the data position, the epoch...), is stored in the metadata and returned by
        load_checkpoint. Returns the checkpoint's directory (docs/checkpoints.md).

        async_save=True (or the config's checkpoint.async_save): returns once this rank's state is
        copied to host memory; a thread writes and commits it while training goes on. The next
        save, a load, wait_for_checkpoint() and close() wait for it and raise its error."""
        if client_state is None:
            client_state = {}
        if not isinstance(client_state, collections.abc.Mapping):
            raise TypeError("tessera: save_checkpoint: client_state must be a dict, got %s" % _type_name(client_state))
        client_state = dict(client_state)
        lr_state = self._client_lr_state()
        if lr_state:
            client_state[_CLIENT_LR_KEY] = lr_state
        try:
            text = json.dumps(client_state, allow_nan=True)
        except (TypeError, ValueError) as e:
            raise TypeError("tessera: save_checkpoint: client_state must be JSON-serializable (tessera stores no "
                            "pickle): %s" % e) from None
        config = hf_config(getattr(self, "module", None))
        return self._c.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag), text, bool(async_save),
                                       "" if config is None else json.dumps(config))

    def wait_for_checkpoint(self):
        """Blocks until an asynchronous save is written and committed; raises its error (on every
        rank) if it failed. Nothing to do after a synchronous save."""
        self._c.wait_for_checkpoint()

    def checkpoint_in_flight(self):
        """Whether an asynchronous save's thread is still writing."""
        return self._c.checkpoint_in_flight()

    def checkpoint_host_bytes(self):
        """The host copy this rank holds for an asynchronous save not yet waited for (0: none)."""
        return self._c.checkpoint_host_bytes()

    def load_checkpoint(self, load_dir, tag=None, load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False, load_module_strict=True):
        """Loads a checkpoint saved by save_checkpoint (tag None: the one save_dir/latest names), at
        this run's data-parallel size and ZeRO stage whatever they were when it was saved. Returns
        (path, client_state), as DeepSpeed's load_checkpoint. Nothing changes unless every rank
        read and verified everything it needs. With tag None and no `latest` in load_dir (a first
        run), it returns (None, None) and trains from scratch, as DeepSpeed does."""
        self._c.wait_for_checkpoint()  # an asynchronous save commits (and names `latest`) first
        if tag is None and not os.path.exists(os.path.join(os.fspath(load_dir), "latest")):
            if comm.get_rank() == 0:
                print("[tessera] load_checkpoint: no %s: nothing loaded (pass tag= to require a checkpoint)"
                      % os.path.join(os.fspath(load_dir), "latest"), flush=True)
            return None, None
        path, text = self._c.load_checkpoint(os.fspath(load_dir), "" if tag is None else str(tag),
                                             bool(load_optimizer_states), bool(load_lr_scheduler_states),
                                             bool(load_module_only), bool(load_module_strict))
        client_state = json.loads(text)
        lr_state = client_state.pop(_CLIENT_LR_KEY, None)
        if lr_state and load_lr_scheduler_states and not load_module_only:
            self._load_client_lr_state(lr_state)
        return path, client_state

    def _finish_auto_resume(self):
        """checkpoint.auto_resume: the engine loaded the latest checkpoint as it was built; the
        client's LR state saved with it reaches the client's optimizer and scheduler (attached
        since). Sets resumed_checkpoint: (path, client_state) as load_checkpoint returns them, or
        (None, None) when nothing was loaded."""
        resumed = self._c.resumed()
        if resumed is None:
            self.resumed_checkpoint = (None, None)
            return
        path, text = resumed
        client_state = json.loads(text)
        lr_state = client_state.pop(_CLIENT_LR_KEY, None)
        if lr_state:
            self._load_client_lr_state(lr_state)
        self.resumed_checkpoint = (path, client_state)

    def _client_lr_state(self):
        optimizer, scheduler = getattr(self, "optimizer", None), getattr(self, "lr_scheduler", None)
        if optimizer is None or not getattr(self, "_lr_from_groups", False):
            return None
        state = {"group_lrs": [float(g["lr"]) for g in optimizer.param_groups]}
        if scheduler is not None:
            try:
                json.dumps(scheduler.state_dict())
            except (TypeError, ValueError) as e:
                raise TypeError("tessera: save_checkpoint: the LR scheduler's state_dict() is not JSON-serializable "
                                "(tessera stores no pickle): %s" % e) from None
            state["scheduler"] = scheduler.state_dict()
        return state

    def _load_client_lr_state(self, state):
        optimizer, scheduler = getattr(self, "optimizer", None), getattr(self, "lr_scheduler", None)
        if optimizer is not None and len(state["group_lrs"]) == len(optimizer.param_groups):
            for g, lr in zip(optimizer.param_groups, state["group_lrs"]):
                g["lr"] = lr
        if scheduler is not None and "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])


    def save_16bit_model(self, save_dir, save_filename="model.safetensors"):
        """The model's weights in their training dtype, whole, as one safetensors file written by
        rank 0 (DeepSpeed's save_16bit_model; ZeRO-3 gathers them): safetensors.torch.load_file and
        load_state_dict read it. For a transformers model, rank 0 writes its config.json beside it:
        from_pretrained(save_dir) loads the directory. Returns the file's path."""
        path = self._c.save_16bit_model(os.fspath(save_dir), save_filename)
        config = hf_config(getattr(self, "module", None))
        if config is not None and comm.get_rank() == 0:
            with open(os.path.join(os.fspath(save_dir), "config.json"), "w") as f:
                json.dump(config, f, indent=2)
        return path

