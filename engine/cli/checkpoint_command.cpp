// `tessera checkpoint export DIR [--tag T] -o model.safetensors [--dtype fp32|bf16|fp16]
//  [--max-shard-size 5GB]` and `tessera checkpoint inspect DIR [--tag T]`: a saved checkpoint read
// without the training processes (engine/checkpoint/export.h).
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include "engine/checkpoint/export.h"
#include "engine/cli/commands.h"

namespace tessera {

void register_checkpoint_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "export or inspect a saved checkpoint");
  cmd->require_subcommand(1);

  auto options = std::make_shared<checkpoint::ExportOptions>();
  auto max_shard = std::make_shared<std::string>("5GB");
  CLI::App* exp = cmd->add_subcommand("export", "consolidated weights under the model's own names, as safetensors");
  exp->add_option("dir", options->dir, "the save directory (its latest checkpoint) or a checkpoint directory")->required();
  exp->add_option("--tag", options->tag, "the checkpoint's tag (default: the one `latest` names)");
  exp->add_option("-o,--output", options->output, "the output file, ending in .safetensors")->required();
  exp->add_option("--dtype", options->dtype, "fp32 (default), bf16 or fp16")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  exp->add_option("--max-shard-size", *max_shard, "split larger models into files of at most this size (5GB)");
  exp->callback([options, max_shard, &exit_code] {
    try {
      options->max_shard_bytes = checkpoint::parse_size(*max_shard);
      const checkpoint::ExportResult r = checkpoint::export_checkpoint(*options);
      std::printf("exported %s: %lld parameters, %lld elements, %.3f GB as %s in %.2f s\n", r.checkpoint.c_str(),
                  (long long)r.parameters, (long long)r.elements, r.bytes / 1e9, options->dtype.c_str(), r.seconds);
      for (const std::string& f : r.files) std::printf("  %s\n", f.c_str());
      exit_code = 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      exit_code = 1;
    }
  });

  auto dir = std::make_shared<std::string>();
  auto tag = std::make_shared<std::string>();
  CLI::App* ins = cmd->add_subcommand("inspect", "tags, layout, parameters and files of a checkpoint, checksums verified");
  ins->add_option("dir", *dir, "the save directory or a checkpoint directory")->required();
  ins->add_option("--tag", *tag, "the checkpoint's tag (default: the one `latest` names)");
  ins->callback([dir, tag, &exit_code] {
    try {
      const checkpoint::InspectReport r = checkpoint::inspect_checkpoint(*dir, *tag);
      std::fputs(r.text.c_str(), stdout);
      exit_code = r.ok ? 0 : 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      exit_code = 1;
    }
  });
}

}  // namespace tessera
