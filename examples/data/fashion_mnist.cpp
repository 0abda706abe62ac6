#include "examples/data/fashion_mnist.h"
#include "examples/data/splitmix.h"

#include <ATen/ops/empty.h>

#include <zlib.h>

#include <algorithm>
#include <stdexcept>
#include <sys/stat.h>
#include <vector>

namespace tessera::examples {

namespace {

std::vector<uint8_t> read_gzip(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::runtime_error("Fashion-MNIST: " + path +
                             " not found; install the data set with `apt-get install dataset-fashion-mnist`");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("Fashion-MNIST: cannot open " + path);
  std::vector<uint8_t> data;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(f, chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error("Fashion-MNIST: cannot decompress " + path + ": " + msg);
    }
    if (n == 0) break;
    data.insert(data.end(), chunk.begin(), chunk.begin() + n);
  }
  gzclose(f);
  return data;
}

uint32_t big_endian32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// IDX: two zero bytes, the type (0x08 = unsigned byte), the number of dimensions, then each
// dimension as a big-endian uint32, then the data.
at::Tensor read_idx(const std::string& path, int expected_dims) {
  std::vector<uint8_t> raw = read_gzip(path);
  auto bad = [&](const std::string& what) { return std::runtime_error("Fashion-MNIST: " + path + ": " + what); };
  if (raw.size() < 4 || raw[0] != 0 || raw[1] != 0) throw bad("not an IDX file");
  if (raw[2] != 0x08) throw bad("element type " + std::to_string(raw[2]) + ", expected 8 (unsigned byte)");
  const int dims = raw[3];
  if (dims != expected_dims) throw bad(std::to_string(dims) + " dimensions, expected " + std::to_string(expected_dims));
  const size_t header = 4 + 4 * static_cast<size_t>(dims);
  if (raw.size() < header) throw bad("truncated header");
  std::vector<int64_t> shape;
  size_t count = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(big_endian32(raw.data() + 4 + 4 * d));
    count *= static_cast<size_t>(shape.back());
  }
  if (raw.size() != header + count)
    throw bad("holds " + std::to_string(raw.size() - header) + " data bytes, the header says " + std::to_string(count));
  at::Tensor t = at::empty(shape, at::kByte);
  std::copy(raw.begin() + static_cast<std::ptrdiff_t>(header), raw.end(), t.data_ptr<uint8_t>());
  return t;
}

}  // namespace

int64_t permute_index(int64_t i, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 0;
  while ((int64_t{1} << bits) < n) ++bits;
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(i);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = splitmix64(key ^ (round * 0x100000001B3ull) ^ right) & mask;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));  // cycle-walk: the domain is at most 4n
  return static_cast<int64_t>(x);
}

ImageBatch rows(const ImageBatch& batch, int64_t begin, int64_t count) {
  if (begin < 0 || count < 0 || begin + count > batch.size())
    throw std::out_of_range("rows(): rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                            ") of a batch of " + std::to_string(batch.size()));
  return {batch.images.narrow(0, begin, count), batch.labels.narrow(0, begin, count)};
}

FashionMnist::FashionMnist(const std::string& directory) {
  const std::string d = directory + "/";
  train_images_ = read_idx(d + "train-images-idx3-ubyte.gz", 3);
  train_labels_ = read_idx(d + "train-labels-idx1-ubyte.gz", 1).to(at::kLong);
  test_images_ = read_idx(d + "t10k-images-idx3-ubyte.gz", 3);
  test_labels_ = read_idx(d + "t10k-labels-idx1-ubyte.gz", 1).to(at::kLong);
  auto check = [&](const at::Tensor& images, const at::Tensor& labels, const char* name) {
    if (images.size(1) != kRows || images.size(2) != kCols)
      throw std::runtime_error(std::string("Fashion-MNIST: ") + name + " images are not 28x28");
    if (images.size(0) != labels.size(0))
      throw std::runtime_error(std::string("Fashion-MNIST: ") + name + " has " + std::to_string(images.size(0)) +
                               " images but " + std::to_string(labels.size(0)) + " labels");
    if (labels.max().item<int64_t>() >= kClasses)
      throw std::runtime_error(std::string("Fashion-MNIST: ") + name + " has a label outside 0..9");
  };
  check(train_images_, train_labels_, "train");
  check(test_images_, test_labels_, "t10k");
}

int64_t FashionMnist::size(Split split) const { return labels(split).size(0); }

ImageBatch FashionMnist::gather(const at::Tensor& indices, Split split) const {
  at::Tensor images = raw_images(split).index_select(0, indices).to(at::kFloat);
  images.div_(255.0).sub_(kMean).div_(kStd);
  return {images.unsqueeze(1), labels(split).index_select(0, indices)};
}

ImageBatch FashionMnist::sample(int64_t batch, int64_t step, uint64_t seed, Split split) const {
  if (batch < 1) throw std::invalid_argument("FashionMnist::sample: batch must be >= 1");
  const int64_t n = size(split);
  const uint64_t base = splitmix64(seed ^ (split == Split::Train ? 0x7472ull : 0x74657374ull));
  at::Tensor indices = at::empty({batch}, at::kLong);
  int64_t* out = indices.data_ptr<int64_t>();
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t position = step * batch + r;
    const int64_t epoch = position / n;
    out[r] = permute_index(position % n, n, splitmix64(base ^ static_cast<uint64_t>(epoch)));
  }
  return gather(indices, split);
}

ImageBatch FashionMnist::range(int64_t begin, int64_t count, Split split) const {
  if (begin < 0 || count < 0 || begin + count > size(split))
    throw std::out_of_range("FashionMnist::range: [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                            ") of " + std::to_string(size(split)) + " examples");
  at::Tensor images = raw_images(split).narrow(0, begin, count).to(at::kFloat);
  images.div_(255.0).sub_(kMean).div_(kStd);
  return {images.unsqueeze(1), labels(split).narrow(0, begin, count)};
}

const char* FashionMnist::class_name(int64_t label) {
  static const char* names[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return label >= 0 && label < kClasses ? names[label] : "?";
}

}  // namespace tessera::examples
