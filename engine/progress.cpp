#include "engine/progress.h"

#include "csrc/device_stream.h"
#include "zero/model.h"

#include <sys/resource.h>

#include <cmath>
#include <string>
#include <cstdio>

namespace tessera {

ProgressMeter::ProgressMeter(int64_t steps_per_print, bool breakdown, bool printer, int data_parallel_size)
    : steps_per_print_(steps_per_print),
      breakdown_(breakdown),
      printer_(printer),
      dp_(data_parallel_size),
      interval_start_(std::chrono::steady_clock::now()) {}

void ProgressMeter::add_samples(int64_t samples, int64_t tokens) {
  samples_ += samples;
  tokens_ += tokens;
}

StepTimes& StepTimes::operator+=(const StepTimes& t) {
  forward_s += t.forward_s;
  backward_s += t.backward_s;
  reduce_s += t.reduce_s;
  optimizer_s += t.optimizer_s;
  allgather_s += t.allgather_s;
  optimizer_steps += t.optimizer_steps;
  return *this;
}

void ProgressMeter::add_times(const StepTimes& t) {
  times_ += t;
  totals_ += t;
}

std::string ProgressMeter::line(int64_t global_step, std::optional<double> mean_loss, double lr, double loss_scale,
                                double grad_norm, const std::string& extra) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - interval_start_).count();
  const double steps = times_.optimizer_steps ? double(times_.optimizer_steps) : 1.0;
  char buf[512];
  // No loss known (loss.backward() by the script, not engine.backward(loss)): "n/a".
  char loss[32] = "n/a";
  if (mean_loss) std::snprintf(loss, sizeof(loss), "%.4f", *mean_loss);
  int n = std::snprintf(buf, sizeof(buf), "step %lld | loss %s | lr %.3e | loss scale %g | grad norm %.4f",
                        (long long)global_step, loss, lr, loss_scale, grad_norm);
  n += std::snprintf(buf + n, sizeof(buf) - n, "%s", extra.c_str());
  // Every data-parallel rank draws the same number of samples: this rank's count times dp.
  if (samples_ > 0) n += std::snprintf(buf + n, sizeof(buf) - n, " | %.1f samples/s", samples_ * dp_ / seconds);
  if (tokens_ > 0) n += std::snprintf(buf + n, sizeof(buf) - n, " | %.0f tokens/s", tokens_ * dp_ / seconds);
  n += std::snprintf(buf + n, sizeof(buf) - n, " | step %.1f ms | peak rss %.2f GiB", 1000 * seconds / steps,
                     peak_rss_bytes() / double(1 << 30));
  std::string out(buf);
  if (breakdown_) {
    std::snprintf(buf, sizeof(buf),
                  "\n  time per step: forward+data %.1f ms | backward %.1f ms | reduce wait %.1f ms | "
                  "optimizer %.1f ms | allgather wait %.1f ms",
                  1000 * times_.forward_s / steps, 1000 * times_.backward_s / steps, 1000 * times_.reduce_s / steps,
                  1000 * times_.optimizer_s / steps, 1000 * times_.allgather_s / steps);
    out += buf;
  }
  interval_start_ = now;
  samples_ = tokens_ = 0;
  times_ = StepTimes{};
  return out;
}

std::string memory_line(const MemoryReport& m, int64_t peak_rss, const c10::Device& device, const DeviceMemory& d) {
  const double mib = 1 << 20, gib = 1 << 30;
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "memory | parameters %.1f | master %.1f | gradients %.1f | optimizer states %.1f | buckets %.1f | "
                "engine %.1f MiB",
                m.parameters / mib, m.master_parameters / mib, m.gradients / mib, m.optimizer_states / mib,
                m.buckets / mib, m.total() / mib);
  std::string out = buf;
  auto add = [&](const char* what, int64_t bytes) {
    if (bytes <= 0) return;
    std::snprintf(buf, sizeof(buf), " | %s %.1f MiB", what, bytes / mib);
    out += buf;
  };
  add("gathered peak", m.gathered_parameters_peak);
  add("host optimizer", m.host_optimizer_bytes);
  add("host parameters", m.host_parameter_bytes);
  add("nvme optimizer", m.offloaded_optimizer_bytes);
  add("nvme parameters", m.offloaded_parameter_bytes);
  std::snprintf(buf, sizeof(buf), " | peak rss %.2f GiB", peak_rss / gib);
  out += buf;
  if (device.is_cuda()) {
    std::snprintf(buf, sizeof(buf), " | %s allocated %.2f (peak %.2f) reserved %.2f (peak %.2f) GiB", device.str().c_str(),
                  d.allocated / gib, d.peak_allocated / gib, d.reserved / gib, d.peak_reserved / gib);
    out += buf;
  }
  return out;
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;
}

}  // namespace tessera
