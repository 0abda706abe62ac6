// `tessera checkpoint export DIR [--tag T] -o model.safetensors [--dtype fp32|bf16|fp16]
//  [--max-shard-size 5GB]` and `tessera checkpoint inspect DIR [--tag T]`: a saved checkpoint read
// without the training processes (engine/checkpoint/export.h). `tessera checkpoint import-deepspeed
// DS_DIR OUT [--tag T] [--optimizer TYPE]`: a DeepSpeed ZeRO checkpoint written as a tessera one by
// python/tessera/deepspeed_checkpoint.py (DeepSpeed's files are pickles: torch reads them).
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "engine/checkpoint/export.h"
#include "engine/cli/commands.h"

namespace tessera {

void register_checkpoint_command(CLI::App& app, int& exit_code) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "export, inspect or import a checkpoint");
  cmd->require_subcommand(1);

  auto options = std::make_shared<checkpoint::ExportOptions>();
  auto max_shard = std::make_shared<std::string>("5GB");
  CLI::App* exp = cmd->add_subcommand("export", "consolidated weights under the model's own names, as safetensors");
  exp->add_option("dir", options->dir, "the save directory (its latest checkpoint) or a checkpoint directory")->required();
  exp->add_option("--tag", options->tag, "the checkpoint's tag (default: the one `latest` names)");
  exp->add_option("-o,--output", options->output, "the output file, ending in .safetensors (with --hf: a directory)")->required();
  exp->add_flag("--hf", options->hf, "a Hugging Face model directory: model.safetensors and the config.json from_pretrained reads");
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

  auto import = std::make_shared<std::vector<std::string>>(4);  // dir, out, tag, optimizer
  CLI::App* imp = cmd->add_subcommand("import-deepspeed", "a DeepSpeed ZeRO 1-3 checkpoint written as a tessera checkpoint");
  imp->add_option("dir", (*import)[0], "DeepSpeed's save directory (its latest checkpoint) or a checkpoint directory")->required();
  imp->add_option("out", (*import)[1], "the tessera save directory to write (OUT/<tag>, OUT/latest)")->required();
  imp->add_option("--tag", (*import)[2], "the DeepSpeed checkpoint's tag (default: the one `latest` names)");
  imp->add_option("--optimizer", (*import)[3], "the tessera optimizer type of its state (default: DeepSpeed's config's)");
  imp->callback([import, &exit_code] {
    std::vector<std::string> args{"-m", "tessera.deepspeed_checkpoint", (*import)[0], (*import)[1]};
    if (!(*import)[2].empty()) args.insert(args.end(), {"--tag", (*import)[2]});
    if (!(*import)[3].empty()) args.insert(args.end(), {"--optimizer", (*import)[3]});
    exit_code = exec_python("checkpoint import-deepspeed", args, "torch and tessera installed (pip install -e .)");
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
