#include "engine/checkpoint/import_writer.h"

#include <stdexcept>

#include "engine/checkpoint/rank_file.h"

namespace tessera::checkpoint {

using nlohmann::json;

ImportWriter::ImportWriter(std::string save_dir, std::string tag, Layout layout)
    : tag_(std::move(tag)), layout_(std::move(layout)), path_(save_dir + "/" + tag_) {
  check_tag(tag_);
  if (layout_.states.empty() || layout_.states.front() != "fp32")
    throw std::invalid_argument("tessera: an imported checkpoint's states begin with \"fp32\" (the weights)");
  writer_ = std::make_unique<CheckpointWriter>(std::move(save_dir), tag_);
}

void ImportWriter::add_file(const std::vector<ImportedPiece>& pieces) {
  const int rank = static_cast<int>(entries_.size());
  RankFile f;
  for (const ImportedPiece& p : pieces) {
    if (p.states.size() != layout_.states.size())
      throw std::invalid_argument("tessera: imported piece of " + p.name + " holds " + std::to_string(p.states.size()) +
                                  " states; the layout has " + std::to_string(layout_.states.size()));
    const int64_t numel = p.states.front().second.numel();
    for (size_t k = 0; k < p.states.size(); ++k) {
      const auto& [state, t] = p.states[k];
      if (state != layout_.states[k] || t.dim() != 1 || t.numel() != numel)
        throw std::invalid_argument("tessera: imported piece of " + p.name + ": state " + std::to_string(k) + " is \"" +
                                    state + "\" of " + std::to_string(t.numel()) + " elements; expected \"" +
                                    layout_.states[k] + "\", 1-D, " + std::to_string(numel));
      f.tensors.emplace_back(state + "/" + p.name, t.detach().to(at::kCPU).contiguous());
    }
    f.add_piece(p.name, p.shape, p.dtype, /*pipeline_stage=*/0, /*tensor_rank=*/-1, TensorSplit{}, p.begin, numel);
  }
  const std::string file = rank_file_name(rank);
  entries_.push_back(write_rank_file(f, writer_->file(file), file, rank).dump());
}

std::string ImportWriter::commit(const json& engine, const json& client_state) {
  Metadata m;
  m.tag = tag_;
  m.layout = layout_;
  m.engine = engine;
  m.client_state = client_state;
  const std::string text = merge(entries_, std::move(m)).to_json().dump(1);
  Metadata::parse(text, writer_->file(kMetadataFile));  // what a load would refuse is refused here
  write_file_durably(writer_->file(kMetadataFile), text);
  writer_->commit();
  return path_;
}

}  // namespace tessera::checkpoint
