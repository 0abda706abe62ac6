"""DeepSpeed's CSV layout (its monitor/csv_monitor.py): under output_path/job_name, one file per
metric, named by its tag with '/' and ' ' replaced by '_' (Train/Samples/lr -> Train_Samples_lr.csv),
a header `step,<the tag's last component>` the first time this process writes the file, then one
`step,value` row per event. Files are appended to: a restarted run adds a second header, as
DeepSpeed's does."""
import os


class CsvMonitor:
    def __init__(self, output_path, job_name):
        self.directory = os.path.join(output_path, job_name)
        os.makedirs(self.directory, exist_ok=True)
        self._files = {}

    def _file(self, tag):
        f = self._files.get(tag)
        if f is None:
            name = tag.replace("/", "_").replace(" ", "_") + ".csv"
            f = open(os.path.join(self.directory, name), "a", buffering=1)
            f.write("step,%s\n" % tag.rsplit("/", 1)[-1])
            self._files[tag] = f
        return f

    def write_events(self, events):
        for tag, value, step in events:
            self._file(tag).write("%d,%r\n" % (step, float(value)))

    def close(self):
        for f in self._files.values():
            f.close()
        self._files = {}
