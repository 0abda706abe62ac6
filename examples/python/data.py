"""The examples' data, byte for byte what the C++ loaders give (examples/data/*.cpp).

FortunesCorpus: Debian's `fortunes` as one byte string (vocabulary 256, no tokenizer), the last ~5%
held out; the global batch for optimizer step s is a pure function of (seed, s).
FashionMnist: Debian's `dataset-fashion-mnist` IDX files; batches walk an endless sequence of
epochs, each a keyed permutation of the split drawn from (seed, epoch).

Every data-parallel rank draws the same GLOBAL batch and trains on its own rows of it, so a run
depends only on train_batch_size, not on how it is split over ranks and accumulation steps.
"""
import gzip
import os
import sys

import numpy as np
import torch

FORTUNES = "/usr/share/games/fortunes"
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
MASK64 = (1 << 64) - 1


def splitmix64(x):
    """splitmix64 on a numpy uint64 array (wrapping arithmetic, as in C++)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def splitmix64_int(x):
    return int(splitmix64(np.array([x & MASK64], dtype=np.uint64))[0])


# ---------------------------------------------------------------------------------------------
# fortunes (examples/data/fortunes_corpus.cpp)


def _append_fortunes(content, out):
    count = 0
    current = bytearray()

    def flush():
        nonlocal count, current
        while current and current[-1] in b"\n\r ":
            current.pop()
        if current:
            out.extend(current)
            out.extend(b"\n%\n")
            count += 1
        current = bytearray()

    lines = content.split(b"\n")
    if content.endswith(b"\n"):
        lines.pop()  # the C++ loop stops at the end of the content: no empty last line
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if line == b"%":
            flush()
        else:
            current.extend(line)
            current.extend(b"\n")
    flush()
    return count


class FortunesCorpus:
    VOCAB = 256

    def __init__(self, directory=FORTUNES, validation_fraction=0.05):
        if not os.path.isdir(directory):
            sys.exit("fortunes corpus: folder not found (%s); install it with `apt-get install fortunes`" % directory)
        names = sorted(n for n in os.listdir(directory)
                       if os.path.isfile(os.path.join(directory, n))
                       and not n.endswith((".dat", ".u8")) and not n.startswith("."))
        text = bytearray()
        self.fortunes = 0
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                self.fortunes += _append_fortunes(f.read(), text)
        if self.fortunes == 0:
            sys.exit("fortunes corpus: no fortune files found (%s)" % directory)
        self.text = np.frombuffer(bytes(text), dtype=np.uint8)
        size = len(text)
        self.split = size
        if validation_fraction > 0:
            target = int(size * (1.0 - validation_fraction))
            boundary = bytes(text).find(b"\n%\n", target)
            self.split = target if boundary < 0 else boundary + 3
            if self.split >= size:
                self.split = target

    def __len__(self):
        return len(self.text)

    def sample(self, batch, seq_len, step, seed, validation=False):
        """`batch` windows of seq_len + 1 bytes for `step`: inputs and targets, int64 [batch, seq_len]."""
        begin, end = (self.split, len(self.text)) if validation else (0, self.split)
        starts = end - begin - seq_len
        base = splitmix64_int(splitmix64_int(seed ^ (0x76616C if validation else 0x7472)) ^ step)
        with np.errstate(over="ignore"):
            rows = np.arange(batch, dtype=np.uint64) + np.uint64(base)
            offsets = (splitmix64(rows) % np.uint64(starts)).astype(np.int64) + begin
        window = torch.from_numpy(self.text[offsets[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int64))
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# Fashion-MNIST (examples/data/fashion_mnist.cpp)


def _read_idx(path, dims):
    if not os.path.isfile(path):
        sys.exit("Fashion-MNIST: %s not found; install it with `apt-get install dataset-fashion-mnist`" % path)
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 + 4 * dims or raw[2] != 0x08 or raw[3] != dims:
        sys.exit("Fashion-MNIST: %s is not an IDX file of %d dimension(s) of bytes" % (path, dims))
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def _permute_index(i, n, key):
    """A keyed permutation of [0, n) (4-round Feistel with cycle-walking), vectorized over i."""
    bits = max(1, int(n - 1).bit_length())
    half = (bits + 1) // 2
    mask = np.uint64((1 << half) - 1)
    x = i.astype(np.uint64)
    todo = np.ones(len(x), dtype=bool)
    result = np.empty_like(x)
    while todo.any():
        left, right = x[todo] >> np.uint64(half), x[todo] & mask
        for rnd in range(4):
            f = splitmix64(np.uint64(key) ^ np.uint64((rnd * 0x100000001B3) & MASK64) ^ right) & mask
            left, right = right, left ^ f
        y = (left << np.uint64(half)) | right
        idx = np.flatnonzero(todo)
        done = y < np.uint64(n)
        result[idx[done]] = y[done]
        x[idx[~done]] = y[~done]
        todo[idx[done]] = False
    return result.astype(np.int64)


class FashionMnist:
    MEAN, STD = 0.2860, 0.3530
    CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

    def __init__(self, directory=FASHION_MNIST):
        d = directory
        self.images = {"train": _read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"), 3),
                       "test": _read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"), 3)}
        self.labels = {"train": _read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"), 1).astype(np.int64),
                       "test": _read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"), 1).astype(np.int64)}

    def size(self, split="train"):
        return len(self.labels[split])

    def _gather(self, indices, split):
        images = torch.from_numpy(self.images[split][indices].astype(np.float32))
        images = (images / 255.0 - self.MEAN) / self.STD
        return images.unsqueeze(1), torch.from_numpy(self.labels[split][indices])

    def sample(self, batch, step, seed, split="train"):
        """The batch for `step`: images float [batch, 1, 28, 28] (normalized), labels int64 [batch]."""
        n = self.size(split)
        base = splitmix64_int(seed ^ (0x7472 if split == "train" else 0x74657374))
        positions = np.arange(step * batch, (step + 1) * batch, dtype=np.int64)
        epochs = positions // n
        indices = np.empty(batch, dtype=np.int64)
        for epoch in np.unique(epochs):
            sel = epochs == epoch
            indices[sel] = _permute_index(positions[sel] % n, n, splitmix64_int(base ^ int(epoch)))
        return self._gather(indices, split)

    def range(self, begin, count, split="test"):
        """Examples [begin, begin + count) of a split, in file order."""
        return self._gather(np.arange(begin, begin + count), split)
