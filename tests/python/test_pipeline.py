"""tessera.pipe (PipelineModule, LayerSpec, TiedLayerSpec, train_batch) against plain PyTorch:
pipeline_worker.py trains a tied-embedding language model cut into stages and checks, on every
rank, each step's loss and global gradient norm (clipping active) and its stage's parameters
against the same layers trained whole in one process — SGD (a wrong gradient scale shows) and
AdamW; 1F1B and GPipe; pp 2 and 4; pp 2 x dp 2 with ZeRO 2."""
import pytest

from conftest import check, launch

CASES = [(2, 2, "1f1b", 0, "SGD"), (2, 2, "gpipe", 1, "AdamW"), (4, 2, "1f1b", 2, "AdamW"), (4, 4, "1f1b", 1, "SGD")]


@pytest.mark.parametrize("ranks,stages,schedule,zero,optimizer", CASES,
                         ids=["pp2-1f1b-z0-sgd", "pp2-gpipe-z1-adamw", "pp2xdp2-z2-adamw", "pp4-z1-sgd"])
def test_pipeline_module_matches_plain_pytorch(ranks, stages, schedule, zero, optimizer):
    result = check(launch(ranks, ["tests/python/pipeline_worker.py", str(stages), schedule, str(zero), optimizer]))
    for rank in range(ranks):
        assert "pipeline ok on rank %d" % rank in result.stdout, result.stdout
