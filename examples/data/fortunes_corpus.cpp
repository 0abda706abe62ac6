#include "examples/data/fortunes_corpus.h"
#include "examples/data/splitmix.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace tessera::examples {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string missing(const std::string& directory, const std::string& why) {
  return "fortunes corpus: " + why + " (" + directory + "); install it with `apt-get install fortunes`";
}

// Appends the fortunes of one file to `out`, each followed by "\n%\n"; returns how many.
int64_t append_fortunes(const std::string& content, std::string& out) {
  int64_t count = 0;
  std::string current;
  auto flush = [&] {
    // Trailing blank lines inside a fortune carry nothing.
    while (!current.empty() && (current.back() == '\n' || current.back() == '\r' || current.back() == ' '))
      current.pop_back();
    if (!current.empty()) {
      out += current;
      out += "\n%\n";
      ++count;
    }
    current.clear();
  };
  size_t pos = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == std::string::npos) end = content.size();
    std::string line = content.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "%") {
      flush();
    } else {
      current += line;
      current += '\n';
    }
    pos = end + 1;
  }
  flush();
  return count;
}

}  // namespace

Batch rows(const Batch& batch, int64_t begin, int64_t count) {
  if (begin < 0 || count < 0 || begin + count > batch.size())
    throw std::out_of_range("rows(): rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                            ") of a batch of " + std::to_string(batch.size()));
  return {batch.inputs.narrow(0, begin, count), batch.targets.narrow(0, begin, count)};
}

FortunesCorpus::FortunesCorpus(const std::string& directory, double validation_fraction) {
  if (!(validation_fraction >= 0.0 && validation_fraction <= 0.5))
    throw std::invalid_argument("FortunesCorpus: validation_fraction must be in [0, 0.5]");
  std::error_code ec;
  if (!fs::is_directory(directory, ec)) throw std::runtime_error(missing(directory, "folder not found"));

  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(directory, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file(ec)) continue;  // sub-folders such as off/
    if (ends_with(name, ".dat") || ends_with(name, ".u8") || name.empty() || name[0] == '.') continue;
    paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());

  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("fortunes corpus: cannot read " + path.string());
    std::ostringstream content;
    content << in.rdbuf();
    int64_t n = append_fortunes(content.str(), text_);
    if (n > 0) {
      fortunes_ += n;
      ++files_;
    }
  }
  if (fortunes_ == 0) throw std::runtime_error(missing(directory, "no fortune files found"));

  // Validation starts at the first fortune boundary at or after (1 - fraction) of the bytes.
  split_ = size();
  if (validation_fraction > 0) {
    const size_t target = static_cast<size_t>(static_cast<double>(size()) * (1.0 - validation_fraction));
    const size_t boundary = text_.find("\n%\n", target);
    split_ = boundary == std::string::npos ? static_cast<int64_t>(target) : static_cast<int64_t>(boundary + 3);
    if (split_ >= size()) split_ = static_cast<int64_t>(target);
  }
}

Batch FortunesCorpus::sample(int64_t batch, int64_t seq_len, int64_t step, uint64_t seed, Split split) const {
  if (batch < 1 || seq_len < 1) throw std::invalid_argument("FortunesCorpus::sample: batch and seq_len must be >= 1");
  const bool train = split == Split::Train;
  const int64_t begin = train ? 0 : split_;
  const int64_t length = train ? split_ : size() - split_;
  const int64_t starts = length - seq_len;  // windows of seq_len + 1 bytes that fit
  if (starts < 1)
    throw std::invalid_argument("FortunesCorpus::sample: seq_len " + std::to_string(seq_len) + " does not fit the " +
                                (train ? "train" : "validation") + " split of " + std::to_string(length) + " bytes");

  const uint64_t base = splitmix64(splitmix64(seed ^ (train ? 0x7472ull : 0x76616Cull)) ^ static_cast<uint64_t>(step));
  at::Tensor window = at::empty({batch, seq_len + 1}, at::kLong);
  int64_t* out = window.data_ptr<int64_t>();
  const auto* bytes = reinterpret_cast<const unsigned char*>(text_.data());
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t offset = begin + static_cast<int64_t>(splitmix64(base + static_cast<uint64_t>(r)) %
                                                        static_cast<uint64_t>(starts));
    for (int64_t t = 0; t <= seq_len; ++t) out[r * (seq_len + 1) + t] = bytes[offset + t];
  }
  return {window.narrow(1, 0, seq_len).contiguous(), window.narrow(1, 1, seq_len).contiguous()};
}

std::string FortunesCorpus::decode(const at::Tensor& bytes) {
  at::Tensor flat = bytes.reshape({-1}).to(at::kLong).contiguous();
  std::string s(static_cast<size_t>(flat.numel()), '\0');
  const int64_t* p = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i) s[static_cast<size_t>(i)] = static_cast<char>(p[i] & 0xFF);
  return s;
}

}  // namespace tessera::examples
