"""What a run reports, written by global rank 0 (DeepSpeed's MonitorMaster, deepspeed/monitor/):

    engine.monitor.write_events([("Train/Samples/my_metric", value, engine.global_samples), ...])

fans a list of (tag, value, step) events out to every writer the config enables, each a file of
its own here:

  csv_monitor   DeepSpeed's CSV files, one per tag (csv_monitor.py), and tessera's JSON lines
                (jsonl.py: metrics.jsonl, one record per step; `tessera plot` draws either)
  tensorboard   event files (tensorboard_monitor.py)
  wandb         a Weights & Biases run, offline without an API key (wandb_monitor.py)
  comet         a Comet experiment, offline without an API key (comet_monitor.py)

The engine writes, at every optimizer step with the global sample count as the step (DeepSpeed's
choice): Train/Samples/train_loss (the step's loss averaged over the data-parallel ranks),
Train/Samples/lr, Train/Samples/loss_scale (fp16), and tessera's Train/Samples/grad_norm,
Train/Samples/samples_per_sec (and tokens_per_sec); with wall_clock_breakdown also
Train/Samples/elapsed_time_ms_forward, _backward, _backward_allreduce (the reduction's wait),
_step and _allgather (the updated parameters' wait). A writer whose package is missing is an
error naming the package when the engine is built."""
from .jsonl import JsonlMonitor, read_metrics

__all__ = ["MonitorMaster", "JsonlMonitor", "read_metrics"]


class MonitorMaster:
    def __init__(self, config, rank=0):
        """config: the engine's effective config (a dict); rank: this process's global rank (only
        rank 0 writes; the others hold no writer)."""
        self.writers = []
        self.jsonl = None
        self.path = None  # metrics.jsonl, on the rank that writes it
        sections = {k: config.get(k) or {} for k in ("csv_monitor", "tensorboard", "wandb", "comet")}
        self.enabled = any(s.get("enabled") for s in sections.values())
        if rank != 0:
            return
        csv = sections["csv_monitor"]
        if csv.get("enabled"):
            import os
            from .csv_monitor import CsvMonitor
            path, job = csv.get("output_path", ""), csv.get("job_name", "DeepSpeedJobName")
            self.path = os.path.join(path, job, "metrics.jsonl")
            self.jsonl = JsonlMonitor(self.path)
            self.writers.append(CsvMonitor(path, job))
        tb = sections["tensorboard"]
        if tb.get("enabled"):
            from .tensorboard_monitor import TensorBoardMonitor
            self.writers.append(TensorBoardMonitor(tb.get("output_path", ""), tb.get("job_name", "DeepSpeedJobName")))
        wb = sections["wandb"]
        if wb.get("enabled"):
            from .wandb_monitor import WandbMonitor
            self.writers.append(WandbMonitor(wb.get("project") or "deepspeed", wb.get("group"), wb.get("team")))
        if sections["comet"].get("enabled"):
            from .comet_monitor import CometMonitor
            self.writers.append(CometMonitor(sections["comet"]))

    def write_events(self, events):
        """events: [(tag, value, step), ...]; values None are left out."""
        events = [(tag, float(value), int(step)) for tag, value, step in events if value is not None]
        for w in self.writers:
            w.write_events(events)

    def write(self, record):
        """tessera's per-step record (metrics.jsonl)."""
        if self.jsonl is not None:
            self.jsonl.write(record)

    def close(self):
        for w in self.writers:
            w.close()
        self.writers = []
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
