"""tessera's metrics as JSON Lines: one object per optimizer step, written by rank 0.

Written with the config's csv_monitor section, beside DeepSpeed's CSV files (csv_monitor.py):
{"csv_monitor": {"enabled": true, "output_path": "runs", "job_name": "gpt"}} writes
runs/gpt/metrics.jsonl. Each line:

  {"step": 10, "loss": 5.43, "lr": 5.4e-05, "loss_scale": 1.0, "grad_norm": 4.70,
   "samples_per_s": 47.3, "tokens_per_s": 6049.0, "step_ms": 338.6, "skipped_steps": 0, "time_s": 3.4}

loss is the step's loss (mean over its micro-steps) averaged over the data-parallel ranks;
tokens_per_s appears when the script reports tokens (Engine.record_batch). `tessera plot` draws it.
"""
import json
import os



class JsonlMonitor:
    def __init__(self, path):
        """path: the file to write (truncated), or None on the ranks that do not write."""
        self.path = path
        self._file = None
        if path is not None:
            directory = os.path.dirname(path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            self._file = open(path, "w", buffering=1)  # line-buffered: a crash keeps every written step

    def write(self, record):
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def read_metrics(path):
    """The records of a metrics file (or of a directory of csv_monitor's CSV files), as a list of
    dicts: tessera/plot.py's reader, which runs without torch."""
    from ..plot import read_records
    return read_records(path)
