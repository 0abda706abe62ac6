"""Context parallelism end to end: the example GPT (causal) trained with Ulysses and ring attention
against one process on the same sequences (tests/python/workers/context_gpt_worker.py): the loss and
the gradient norm every step and every parameter at the end. Context 2 and 4 for each method; context
2 x data 2 at ZeRO 2 and 3 (gradients averaged and shards partitioned over data x context); context
2 x tensor 2 (heads split by tp first, then by context); bf16; activation checkpointing; DeepSpeed's
sequence_parallel_size. And the errors: degrees that do not divide the world, the two keys
disagreeing, a sequence that does not divide."""
import pytest

from conftest import check, launch


def run(ranks, *cases):
    """Each case (METHOD, CP, STAGE, OPTIMIZER, more...) in turn, all by one launch of the ranks (the
    same grid for all: a process's first initialize fixes the process groups' degrees)."""
    argv = []
    for case in cases:
        argv += (["+"] if argv else []) + [str(a) for a in case]
    result = check(launch(ranks, ["tests/python/workers/context_gpt_worker.py"] + argv))
    for method, cp, stage, optimizer, *more in cases:
        assert "ok %s cp %d stage %d %s %s" % (method, cp, stage, optimizer, " ".join(map(str, more))) in result.stdout, \
            result.stdout + result.stderr


def test_on_2_ranks_cp_2_by_each_method_bf16_checkpointing_and_deepspeeds_key_match_one_process():
    """Ulysses and ring at cp 2; bf16 within its tolerance; activation checkpointing; DeepSpeed's
    sequence_parallel_size setting the degree."""
    run(2, ("ulysses", 2, 1, "sgd"), ("ring", 2, 1, "sgd"), ("ring", 2, 1, "sgd", "bf16"),
        ("ulysses", 2, 2, "sgd", "checkpointing"), ("ring", 2, 1, "sgd", "deepspeed_key"))


# (One launch per grid: the process groups' degrees are fixed by a process's first initialize.)
def test_cp_4_by_each_method_matches_one_process():
    run(4, ("ulysses", 4, 1, "sgd"), ("ring", 4, 1, "sgd"))


def test_context_2_by_data_2_at_zero_2_and_3_and_built_under_zero_init_matches_one_process():
    """The model built under zero.Init: partitioned over data x context."""
    run(4, ("ring", 2, 2, "adamw"), ("ulysses", 2, 3, "sgd"), ("ring", 2, 3, "adamw"), ("ring", 2, 3, "sgd", "zero_init"))


def test_context_2_by_tensor_2_matches_one_process():
    """Heads split by tp first, then by context."""
    run(4, ("ulysses", 2, 1, "adamw", "tp", 2), ("ring", 2, 1, "sgd", "tp", 2))


def _initialize(code):
    return launch(2, ["-c", "import torch, tessera\n"
                            "model = torch.nn.Linear(4, 4)\n" + code])


def test_a_context_size_that_does_not_divide_the_world_names_the_key():
    result = _initialize("tessera.initialize(model=model, config={'train_micro_batch_size_per_gpu': 1, "
                         "'context_parallel': {'size': 4}})")
    assert result.returncode != 0
    assert "context_parallel.size" in result.stderr and "world size 2 is not divisible" in result.stderr, result.stderr


def test_sequence_parallel_size_sets_the_degree_and_disagreeing_with_context_parallel_size_is_refused():
    from tessera import _C
    cfg, _ = _C.load_config('{"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2, '
                            '"context_parallel": {"method": "ring"}}', 8)
    assert (cfg.context, cfg.data, cfg.context_method) == (2, 4, "ring")
    with pytest.raises(Exception, match=r"sequence_parallel_size 2 != context_parallel.size 4"):
        _C.load_config('{"train_micro_batch_size_per_gpu": 1, "sequence_parallel_size": 2, '
                       '"context_parallel": {"size": 4}}', 8)


def test_an_unknown_method_is_refused_with_the_choices():
    result = _initialize("tessera.initialize(model=model, config={'train_micro_batch_size_per_gpu': 1, "
                         "'context_parallel': {'size': 2, 'method': 'zigzag'}})")
    assert result.returncode != 0
    assert "context_parallel.method" in result.stderr and "ulysses" in result.stderr, result.stderr


def test_a_sequence_that_does_not_divide_names_its_length_and_the_helper():
    result = launch(2, ["-c", "import torch, tessera\nfrom tessera import comm, sequence\n"
                              "comm.parallel_context('gloo', context=2)\n"
                              "sequence.shard(torch.zeros(1, 30), dim=1, method='ring')"])
    assert result.returncode != 0
    assert "a sequence of length 30 does not divide over context_parallel.size 2" in result.stderr, result.stderr
    assert "pad it to a multiple of 4 (tessera.sequence.pad_for_context)" in result.stderr


def test_a_model_without_attention_to_parallelize_is_refused():
    result = _initialize("tessera.initialize(model=model, config={'train_micro_batch_size_per_gpu': 1, "
                         "'context_parallel': {'size': 2}})")
    assert result.returncode != 0
    assert "no attention module found" in result.stderr, result.stderr
