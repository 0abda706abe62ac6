// The config's sections for watching a run: the csv/TensorBoard monitors, wandb, comet, the flops
// profiler and the comms logger. Part of the typed config (engine/config/config.h, which holds the
// top-level Config and explains the `fields(v)` convention).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config_rules.h"

namespace tessera {

// csv_monitor and tensorboard share DeepSpeed's shape.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("output_path", output_path);
    v("job_name", job_name);
  }
};

// DeepSpeed's "wandb" section (Weights & Biases; python/tessera/monitor/wandb_monitor.py). `team` is
// wandb's entity. Offline when WANDB_MODE says so or there is no network.
struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group, team;
  std::string project = "deepspeed";
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("group", group);
    v("team", team);
    v("project", project);
  }
};

// DeepSpeed's "comet" section (Comet ML; python/tessera/monitor/comet_monitor.py).
struct CometConfig {
  bool enabled = false;
  int64_t samples_log_interval = 100;  // a metric is logged when this many samples passed since its last
  std::optional<std::string> project, workspace, api_key, experiment_name, experiment_key, mode;
  std::optional<bool> online;
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("samples_log_interval", samples_log_interval, at_least<int64_t>(1));
    v("project", project);
    v("workspace", workspace);
    v("api_key", api_key);
    v("experiment_name", experiment_name);
    v("experiment_key", experiment_key);
    v("online", online);
    v("mode", mode, one_of({"get", "create", "get_or_create"}));
  }
};

// DeepSpeed's "flops_profiler" section (engine/flops_profiler.h for C++ models' units,
// python/tessera/flops_profiler.py for Python modules): at profile_step, rank 0 prints each unit's
// or module's parameters, MACs, latency and FLOP/s; peak_tflops (tessera's) gives the MFU.
struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;  // activation checkpointing's extra forward, as a share of one
  int64_t profile_step = 1;
  int64_t module_depth = -1;          // -1: every depth
  int64_t top_modules = 1;
  bool detailed = true;
  std::optional<std::string> output_file;
  std::optional<double> peak_tflops;  // the device's peak, for the model FLOPs utilization
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("recompute_fwd_factor", recompute_fwd_factor, at_least(0.0));
    v("profile_step", profile_step, at_least<int64_t>(1));
    v("module_depth", module_depth, at_least<int64_t>(-1));
    v("top_modules", top_modules, at_least<int64_t>(1));
    v("detailed", detailed);
    v("output_file", output_file);
    v("peak_tflops", peak_tflops, at_least(0.0));
  }
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  bool debug = false;
  std::vector<std::string> prof_ops;
  template <class V> void fields(V& v) {
    v("enabled", enabled);
    v("verbose", verbose);
    v("prof_all", prof_all);
    v("debug", debug);
    v("prof_ops", prof_ops);
  }
};

}  // namespace tessera
