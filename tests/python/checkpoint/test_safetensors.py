"""tessera's safetensors files (engine/checkpoint/safetensors.h, the container of its checkpoints)
and the `safetensors` package read each other's files, every dtype bit for bit, with the metadata."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tessera import _C

TENSORS = {
    "f32": torch.randn(3, 5), "f64": torch.randn(4, dtype=torch.float64), "f16": torch.randn(2, 3).half(),
    "bf16": torch.randn(7).bfloat16(), "i64": torch.arange(-5, 6), "i32": torch.arange(10, dtype=torch.int32),
    "i16": torch.arange(3, dtype=torch.int16), "i8": torch.arange(-3, 3, dtype=torch.int8),
    "u8": torch.arange(200, 210, dtype=torch.uint8), "bool": torch.arange(6) % 2 == 1, "scalar": torch.randn(()),
    "empty": torch.zeros(0, 4),
}


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("direct", [False, True], ids=["write_safetensors", "async_save_image"])
def test_the_package_reads_what_tessera_writes(tmp_path, direct):
    # direct: as an asynchronous save writes its rank file (engine/checkpoint/file_image.h), the
    # header padded with spaces to 4 KiB and the file written with O_DIRECT.
    path = str(tmp_path / "t.safetensors")
    _C.checkpoint.write_safetensors(path, list(TENSORS.items()), {"format": "pt", "step": "3"}, direct=direct)
    header_bytes = int.from_bytes(open(path, "rb").read(8), "little")
    assert (8 + header_bytes) % (4096 if direct else 8) == 0
    loaded = load_file(path)
    assert set(loaded) == set(TENSORS)
    for name, t in TENSORS.items():
        assert same(loaded[name], t), name
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt", "step": "3"}


def test_tessera_reads_what_the_package_writes(tmp_path):
    path = str(tmp_path / "p.safetensors")
    save_file(TENSORS, path, metadata={"writer": "safetensors"})
    tensors, metadata = _C.checkpoint.read_safetensors(path)
    assert metadata == {"writer": "safetensors"}
    assert set(tensors) == set(TENSORS)
    for name, t in TENSORS.items():
        assert same(tensors[name], t), name


def test_a_truncated_file_is_a_value_error_naming_it(tmp_path):
    path = tmp_path / "cut.safetensors"
    save_file({"w": torch.randn(64)}, str(path))
    path.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(ValueError, match=r"cut\.safetensors: tensor \"w\": data_offsets .* outside the file"):
        _C.checkpoint.read_safetensors(str(path))
