"""Comet (the config's comet section, DeepSpeed's keys: project, workspace, api_key,
experiment_name, experiment_key, online, mode, samples_log_interval), through comet_ml.start. The
experiment is offline, written as an archive under COMET_OFFLINE_DIRECTORY (default ./.cometml-runs)
for a later upload, when `online` is false or no API key is given (the key, COMET_API_KEY or
~/.comet.config). As DeepSpeed's, a metric is logged when samples_log_interval samples have passed
since it was last logged (its first event always)."""
import os


class CometMonitor:
    def __init__(self, section):
        try:
            import comet_ml
        except ImportError as e:
            raise ImportError("tessera: the config enables comet, which needs the `comet_ml` package "
                              "(pip install comet_ml): %s" % e) from None
        api_key = section.get("api_key") or os.environ.get("COMET_API_KEY")
        online = section.get("online")
        if online is None:
            online = bool(api_key) or os.path.isfile(os.path.join(os.path.expanduser("~"), ".comet.config"))
        self.offline = not online
        self.experiment = comet_ml.start(
            api_key=api_key, project=section.get("project"), workspace=section.get("workspace"),
            experiment_key=section.get("experiment_key"), mode=section.get("mode") or "get_or_create",
            online=online)
        if section.get("experiment_name"):
            self.experiment.set_name(section["experiment_name"])
        self.interval = int(section.get("samples_log_interval", 100))
        self._last = {}

    def write_events(self, events):
        for tag, value, step in events:
            last = self._last.get(tag)
            if last is None or step - last >= self.interval:
                self.experiment.log_metric(tag, value, step=step)
                self._last[tag] = step

    def close(self):
        self.experiment.end()
