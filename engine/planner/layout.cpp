#include "engine/planner/layout.h"

namespace tessera::planner {

using nlohmann::json;

std::string Layout::label() const {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " · ") + part; };
  add("dp " + std::to_string(dp));
  if (tp > 1) add("tp " + std::to_string(tp));
  if (pp > 1) add("pp " + std::to_string(pp));
  if (pp > 1 && schedule == "zb_h1") add("zb-h1");
  if (pp > 1 && schedule == "interleaved_1f1b") add("interleaved × " + std::to_string(virtual_stages));
  if (pp > 1 && schedule == "zb_v") add("zb-v");
  if (pp > 1 && schedule == "gpipe") add("gpipe");
  if (cp > 1) add("cp " + std::to_string(cp));
  if (ep > 1) add("ep " + std::to_string(ep));
  add("zero " + std::to_string(zero_stage));
  if (offload_optimizer != "none") add("optimizer on " + offload_optimizer);
  if (offload_param != "none") add("params on " + offload_param);
  if (activation_checkpointing != "none") add("checkpointing " + activation_checkpointing);
  add("micro " + std::to_string(micro_batch) + " × " + std::to_string(gradient_accumulation));
  return s;
}

TrainingSetup apply(const Layout& l, TrainingSetup s) {
  s.tp = l.tp;
  s.pp = l.pp;
  s.cp = l.cp;
  s.zero_stage = l.zero_stage;
  s.offload_optimizer = l.offload_optimizer;
  s.offload_param = l.offload_param;
  s.activation_checkpointing = l.activation_checkpointing;
  s.checkpoint_interval = 1;
  s.micro_batch = l.micro_batch;
  s.gradient_accumulation = l.gradient_accumulation;
  s.pipeline_micro_batches = 0;  // = the accumulation steps
  s.pipeline_schedule = l.schedule;
  s.virtual_stages = l.virtual_stages;
  if (s.moe) s.moe->ep_size = l.ep;
  return s;
}

json as_config(const Layout& l, json c, int64_t layers, const std::string& nvme_path) {
  if (!c.is_object()) c = json::object();
  c.erase("train_batch_size");
  c["train_batch_size"] = l.global_batch();
  c["train_micro_batch_size_per_gpu"] = l.micro_batch;
  c["gradient_accumulation_steps"] = l.gradient_accumulation;
  json& z = c["zero_optimization"];
  if (!z.is_object()) z = json::object();
  z["stage"] = l.zero_stage;
  auto offload = [&](const char* key, const std::string& device) {
    json& o = z[key];
    if (!o.is_object()) o = json::object();
    o["device"] = device;
    if (device == "nvme" && !o.contains("nvme_path")) o["nvme_path"] = nvme_path;
    if (device == "none") o.erase("nvme_path");
  };
  offload("offload_optimizer", l.offload_optimizer);
  offload("offload_param", l.offload_param);
  c["tensor_parallel"] = c.contains("tensor_parallel") && c["tensor_parallel"].is_object() ? c["tensor_parallel"] : json::object();
  c["tensor_parallel"]["tp_size"] = l.tp;
  if (l.tp == 1) c["tensor_parallel"].erase("sequence_parallel");  // nothing to split the sequence over
  json& p = c["pipeline"];
  if (!p.is_object()) p = json::object();
  p["stages"] = l.pp;
  p.erase("micro_batches");  // the accumulation steps
  p["schedule"] = l.schedule;
  p["virtual_stages"] = l.virtual_stages;
  c["context_parallel"] = c.contains("context_parallel") && c["context_parallel"].is_object() ? c["context_parallel"] : json::object();
  c["context_parallel"]["size"] = l.cp;
  c.erase("sequence_parallel_size");
  if (c.contains("moe") && c["moe"].is_object()) c["moe"]["ep_size"] = l.ep;
  const bool checkpointing = l.activation_checkpointing != "none";
  if (l.pp > 1) {
    if (checkpointing) p["activation_checkpoint_interval"] = 1;
    else p.erase("activation_checkpoint_interval");
    c.erase("activation_checkpointing");
  } else {
    p.erase("activation_checkpoint_interval");
    if (checkpointing) {
      json& a = c["activation_checkpointing"];
      if (!a.is_object()) a = json::object();
      a["number_checkpoints"] = layers;
    } else {
      c.erase("activation_checkpointing");
    }
  }
  // The defaults are left out (a section left empty goes).
  auto drop = [&](json& section, const char* key, const json& default_value) {
    if (section.contains(key) && section[key] == default_value) section.erase(key);
  };
  drop(z["offload_optimizer"], "device", "none");
  drop(z["offload_param"], "device", "none");
  drop(c["tensor_parallel"], "tp_size", 1);
  drop(p, "stages", 1);
  drop(p, "schedule", "1f1b");
  drop(p, "virtual_stages", 1);
  drop(c["context_parallel"], "size", 1);
  for (const char* key : {"offload_optimizer", "offload_param"})
    if (z[key].empty()) z.erase(key);
  for (const char* key : {"tensor_parallel", "pipeline", "context_parallel"})
    if (c[key].empty()) c.erase(key);
  return c;
}

json to_json(const Layout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"ep", l.ep},
          {"schedule", l.schedule},
          {"virtual_stages", l.virtual_stages},
          {"zero_stage", l.zero_stage},
          {"offload_optimizer", l.offload_optimizer},
          {"offload_param", l.offload_param},
          {"activation_checkpointing", l.activation_checkpointing},
          {"micro_batch", l.micro_batch},
          {"gradient_accumulation_steps", l.gradient_accumulation},
          {"label", l.label()}};
}

}  // namespace tessera::planner
