// The progress line printed every `steps_per_print` optimizer steps on rank 0:
//   step 20 | loss 2.4311 | lr 3.000e-04 | loss scale 1 | grad norm 0.8123 | 912.4 samples/s |
//   116787 tokens/s | step 140.2 ms | peak rss 1.21 GiB
// With wall_clock_breakdown, a second line splits the step time into disjoint parts: forward (the
// user's code and data between backward calls), backward (autograd, buckets launched as they
// fill), reduce wait (the reductions still in flight after autograd), optimizer (norm, update,
// launching the allgathers) and allgather wait (waiting for updated parameters: in the next
// forward's units with overlap_comm, else at the end of the step; at ZeRO-3 also the gathers a
// unit's forward or backward waits for).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace tessera {

struct StepTimes {
  double forward_s = 0, backward_s = 0, reduce_s = 0, optimizer_s = 0, allgather_s = 0;
  int64_t optimizer_steps = 0;
  StepTimes& operator+=(const StepTimes& t);
};

class ProgressMeter {
 public:
  ProgressMeter(int64_t steps_per_print, bool breakdown, bool printer, int data_parallel_size);

  void add_samples(int64_t samples, int64_t tokens);
  void add_times(const StepTimes& t);
  bool due(int64_t global_step) const { return global_step % steps_per_print_ == 0; }
  // Formats the line (the caller averages the interval's loss across ranks first) and resets the interval.
  // `extra` goes after the grad norm (the 1-bit family's phase and bytes sent).
  std::string line(int64_t global_step, std::optional<double> mean_loss, double lr, double loss_scale, double grad_norm,
                   const std::string& extra = {});
  bool printer() const { return printer_; }
  // Every time added since construction (the Python API's wall_clock_breakdown()).
  const StepTimes& totals() const { return totals_; }

 private:
  int64_t steps_per_print_;
  bool breakdown_, printer_;
  int dp_;
  std::chrono::steady_clock::time_point interval_start_;
  int64_t samples_ = 0, tokens_ = 0;
  StepTimes times_, totals_;
};

// Peak resident set size of this process, in bytes.
int64_t peak_rss_bytes();

// memory_breakdown's line (rank 0, every steps_per_print steps): the engine's buffers by kind (in
// MiB; ZeRO-3's gathered parameters at their peak, what offload keeps in host memory or files),
// the process's peak RSS and, on a GPU, the device allocator's allocated and reserved bytes now
// and at their peak:
//   memory | parameters 12.0 | master 0.0 | gradients 24.0 | optimizer states 48.0 | buckets 2.0 |
//   engine 86.0 MiB | peak rss 1.21 GiB | cuda:0 allocated 0.31 (peak 0.52) reserved 0.60 (peak 0.60) GiB
struct MemoryReport;
struct DeviceMemory;
std::string memory_line(const MemoryReport& m, int64_t peak_rss, const c10::Device& device, const DeviceMemory& d);

}  // namespace tessera
