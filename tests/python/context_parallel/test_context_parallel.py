"""Context parallelism end to end: the example GPT (causal) trained with Ulysses and ring attention
against one process on the same sequences (tests/python/workers/context_gpt_worker.py): the loss and
the gradient norm every step and every parameter at the end. Context 2 and 4 for each method; context
2 x data 2 at ZeRO 2 and 3 (gradients averaged and shards partitioned over data x context); context
2 x tensor 2 (heads split by tp first, then by context); bf16; activation checkpointing; DeepSpeed's
sequence_parallel_size. And the errors: degrees that do not divide the world, the two keys
disagreeing, a sequence that does not divide."""
import pytest

from conftest import check, launch


def run(ranks, method, cp, stage, optimizer, *more):
    argv = [method, str(cp), str(stage), optimizer] + [str(m) for m in more]
    result = check(launch(ranks, ["tests/python/workers/context_gpt_worker.py"] + argv))
    assert "ok %s cp %d stage %d %s" % (method, cp, stage, optimizer) in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("method", ["ulysses", "ring"])
def test_context_parallel_gpt_matches_one_process(method, cp):
    run(cp, method, cp, 1, "sgd")


@pytest.mark.parametrize("method, stage, optimizer", [("ring", 2, "adamw"), ("ulysses", 3, "sgd"), ("ring", 3, "adamw")])
def test_context_2_by_data_2_at_zero_2_and_3_matches_one_process(method, stage, optimizer):
    run(4, method, 2, stage, optimizer)


def test_a_model_built_under_zero_init_partitioned_over_data_by_context():
    run(4, "ring", 2, 3, "sgd", "zero_init")


@pytest.mark.parametrize("method, optimizer", [("ulysses", "adamw"), ("ring", "sgd")])
def test_context_2_by_tensor_2_matches_one_process(method, optimizer):
    run(4, method, 2, 1, optimizer, "tp", 2)


def test_bf16_within_its_tolerance():
    run(2, "ring", 2, 1, "sgd", "bf16")


def test_with_activation_checkpointing():
    run(2, "ulysses", 2, 2, "sgd", "checkpointing")


def test_deepspeeds_sequence_parallel_size_sets_the_degree():
    run(2, "ring", 2, 1, "sgd", "deepspeed_key")


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
