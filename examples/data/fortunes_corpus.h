// The `fortunes` corpus (Debian package `fortunes`) as one byte string for a byte-level language
// model: vocabulary 256, no tokenizer.
//
// Every text file of the corpus folder is read, in name order (the *.dat index files, the *.u8
// copies and sub-folders such as `off/` are skipped). Fortunes are separated in those files by lines
// holding only "%"; the corpus keeps that separator ("\n%\n" after every fortune), so the model
// sees where one fortune ends. The last ~5% of the bytes (cut at a fortune boundary) are held out
// for validation.
//
// Sampling is stateless: the rows of the batch for `step` depend only on (seed, step, split), so
// every data-parallel rank draws the same GLOBAL batch and takes its own rows with `rows()`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace tessera::examples {

// A language-model batch: inputs and targets int64 [batch, seq_len], targets = inputs shifted by one.
struct Batch {
  at::Tensor inputs;
  at::Tensor targets;
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

// Rows [begin, begin + count) of `batch` (views, no copy). Throws std::out_of_range when they do
// not fit.
Batch rows(const Batch& batch, int64_t begin, int64_t count);

class FortunesCorpus {
 public:
  enum class Split { Train, Validation };
  static constexpr const char* kDefaultDirectory = "/usr/share/games/fortunes";
  static constexpr int64_t kVocabSize = 256;

  // Reads the corpus. Throws std::runtime_error ("... apt-get install fortunes") when the folder is
  // missing or holds no fortunes. `validation_fraction` in [0, 0.5].
  explicit FortunesCorpus(const std::string& directory = kDefaultDirectory, double validation_fraction = 0.05);

  const std::string& text() const { return text_; }  // the whole corpus, train then validation
  int64_t size() const { return static_cast<int64_t>(text_.size()); }
  int64_t train_size() const { return split_; }
  int64_t validation_size() const { return size() - split_; }
  int64_t fortunes() const { return fortunes_; }  // number of fortunes read
  int64_t files() const { return files_; }        // number of files read
  int64_t vocab_size() const { return kVocabSize; }

  // `batch` windows of seq_len + 1 bytes from the split, at offsets drawn from (seed, step, row):
  // the same arguments give the same batch on every rank and every run.
  Batch sample(int64_t batch, int64_t seq_len, int64_t step, uint64_t seed, Split split = Split::Train) const;

  // Bytes back to text (any integer tensor of byte values), for printing samples.
  static std::string decode(const at::Tensor& bytes);

 private:
  std::string text_;
  int64_t split_ = 0;  // first validation byte
  int64_t fortunes_ = 0;
  int64_t files_ = 0;
};

}  // namespace tessera::examples
