"""Context-parallel attention alone against SDPA over the whole sequence
(tests/python/workers/context_attention_worker.py): Ulysses and ring attention on 2 and 4 ranks,
causal and not, the output and the q, k, v gradients of every rank's positions; ring's explicit
fp32 kernel as well as the CPU flash kernel; bf16; a sequence whose chunks are uneven until
pad_for_context pads it; a head count Ulysses cannot split (ring takes it)."""
import pytest

from conftest import check, launch


def run(ranks, method, causal=1, kernel="auto", dtype="fp32", length=32, heads=4):
    argv = [method, str(causal), kernel, dtype, str(length), str(heads)]
    result = check(launch(ranks, ["tests/python/workers/context_attention_worker.py"] + argv))
    assert "ok %s causal %d" % (method, causal) in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_causal_attention_matches_sdpa_on_the_whole_sequence(ranks, method):
    run(ranks, method)


@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_attention_without_a_mask_matches_sdpa(method):
    run(2, method, causal=0)


def test_ring_attentions_explicit_kernel_matches_sdpa():
    run(4, "ring", kernel="math")


def test_ring_attention_takes_heads_ulysses_cannot_split():
    run(4, "ring", heads=3)


@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_a_sequence_padded_by_the_helper_matches_on_its_real_positions(method):
    run(4 if method == "ring" else 2, method, length=29)


def test_bf16_within_its_tolerance():
    run(2, "ring", dtype="bf16")


def test_ulysses_refuses_heads_it_cannot_split_and_names_ring():
    result = launch(2, ["tests/python/workers/context_attention_worker.py", "ulysses", "1", "auto", "fp32", "32", "3"])
    assert result.returncode != 0
    assert "3 heads (per tensor-parallel rank) are not divisible by context_parallel.size 2" in result.stderr
    assert 'use context_parallel.method "ring"' in result.stderr
