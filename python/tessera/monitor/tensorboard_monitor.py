"""TensorBoard event files (the config's tensorboard section, DeepSpeed's keys): written under
output_path/job_name by torch.utils.tensorboard's SummaryWriter, which needs the `tensorboard`
package; each event is add_scalar(tag, value, step), flushed after each batch of events."""


class TensorBoardMonitor:
    def __init__(self, output_path, job_name):
        import os
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ImportError("tessera: the config enables tensorboard, which needs the `tensorboard` package "
                              "(pip install tensorboard): %s" % e) from None
        self.directory = os.path.join(output_path, job_name)
        self._writer = SummaryWriter(log_dir=self.directory)

    def write_events(self, events):
        for tag, value, step in events:
            self._writer.add_scalar(tag, value, step)
        self._writer.flush()

    def close(self):
        self._writer.close()
