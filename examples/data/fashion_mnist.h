// Fashion-MNIST (Debian package `dataset-fashion-mnist`): 60,000 train and 10,000 test images of
// 28×28 grey levels in 10 classes, read from the gzip-compressed IDX files.
//
// The raw bytes are kept (47 MB for train); batches come out as float [N, 1, 28, 28], scaled to
// [0, 1] and normalized with the train set's mean 0.2860 and std 0.3530, and int64 labels [N].
//
// Sampling is stateless: the batch for `step` is positions [step·batch, (step+1)·batch) of an
// endless sequence of epochs, each epoch a permutation of the split drawn from (seed, epoch). So
// every data-parallel rank draws the same GLOBAL batch and takes its own rows with `rows()`, and
// within an epoch no image repeats.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace tessera::examples {

struct ImageBatch {
  at::Tensor images;  // float [N, 1, 28, 28], normalized
  at::Tensor labels;  // int64 [N]
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

// Rows [begin, begin + count) of `batch` (views, no copy). Throws std::out_of_range when they do
// not fit.
ImageBatch rows(const ImageBatch& batch, int64_t begin, int64_t count);

class FashionMnist {
 public:
  enum class Split { Train, Test };
  static constexpr const char* kDefaultDirectory = "/usr/share/datasets/fashion-mnist";
  static constexpr double kMean = 0.2860;
  static constexpr double kStd = 0.3530;
  static constexpr int64_t kClasses = 10;
  static constexpr int64_t kRows = 28;
  static constexpr int64_t kCols = 28;

  // Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Throws std::runtime_error
  // ("... apt-get install dataset-fashion-mnist") when a file is missing, or naming the file and
  // what is wrong when it is malformed.
  explicit FashionMnist(const std::string& directory = kDefaultDirectory);

  int64_t size(Split split = Split::Train) const;

  // The batch for `step` (see above); deterministic in (seed, step, batch).
  ImageBatch sample(int64_t batch, int64_t step, uint64_t seed, Split split = Split::Train) const;

  // Examples [begin, begin + count) of a split in file order, e.g. to evaluate on the test set.
  ImageBatch range(int64_t begin, int64_t count, Split split = Split::Test) const;

  // Raw uint8 images [N, 28, 28] and int64 labels [N] of a split.
  const at::Tensor& raw_images(Split split) const { return split == Split::Train ? train_images_ : test_images_; }
  const at::Tensor& labels(Split split) const { return split == Split::Train ? train_labels_ : test_labels_; }

  static const char* class_name(int64_t label);  // "T-shirt/top", "Trouser", ...

 private:
  ImageBatch gather(const at::Tensor& indices, Split split) const;

  at::Tensor train_images_, train_labels_, test_images_, test_labels_;
};

// Position `i` of a permutation of [0, n) chosen by `key`: a 4-round Feistel network on the next
// even power of two, cycle-walked into [0, n). Bijective on [0, n) for every key; no table.
int64_t permute_index(int64_t i, int64_t n, uint64_t key);

}  // namespace tessera::examples
