"""Weights & Biases (the config's wandb section, DeepSpeed's keys: project, group, team as wandb's
entity). The run is offline, written under the working directory's wandb/ (or WANDB_DIR) for a
later `wandb sync`, when WANDB_MODE says so or when no API key is set (WANDB_API_KEY, or a
`wandb login` in ~/.netrc): a training job never waits on a network it may not have."""
import os


def _has_api_key():
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = os.path.join(os.path.expanduser("~"), ".netrc")
    return os.path.isfile(netrc) and "api.wandb.ai" in open(netrc).read()


class WandbMonitor:
    def __init__(self, project, group=None, team=None):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("tessera: the config enables wandb, which needs the `wandb` package (pip install wandb): "
                              "%s" % e) from None
        mode = os.environ.get("WANDB_MODE") or ("online" if _has_api_key() else "offline")
        self._wandb = wandb
        self.run = wandb.init(project=project, group=group, entity=team, mode=mode)
        self.offline = mode != "online"

    def write_events(self, events):
        by_step = {}
        for tag, value, step in events:
            by_step.setdefault(step, {})[tag] = value
        for step in sorted(by_step):
            self.run.log(by_step[step], step=step)

    def close(self):
        self.run.finish()
