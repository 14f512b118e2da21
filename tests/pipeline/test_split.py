"""Where the pipeline cuts: the balanced partition, the model's layers, and the split found by measurement."""

import itertools
import random

import pytest
import torch
from torch import nn

from trainscale.models import build_model
from trainscale.models.planted import one_heavy
from trainscale.strategies.layers import pipeline_layers, profile_layers
from trainscale.strategies.split import balanced_split, imbalance, named_split, stage_costs, uniform_split


def _brute_force(costs, parts):
    n = len(costs)
    return min(max(stage_costs(costs, [0, *cuts])) for cuts in itertools.combinations(range(1, n), parts - 1))


def test_balanced_split_is_optimal():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 8)
        costs = [rng.choice([0.5, 1.0, 2.0, 4.0, rng.random()]) for _ in range(n)]
        parts = rng.randint(1, n)
        starts = balanced_split(costs, parts)
        assert starts[0] == 0 and len(starts) == parts and starts == sorted(set(starts))
        assert max(stage_costs(costs, starts)) == pytest.approx(_brute_force(costs, parts))


def test_uniform_and_named_splits():
    assert uniform_split(5, 2) == [0, 3] and uniform_split(4, 4) == [0, 1, 2, 3]
    names = ["1", "3", "5", "7"]
    assert named_split(names, ["5"], 2) == [0, 2]
    for firsts, words in ((["9"], "no layer named '9'"), (["1"], "in model order"), (["3", "5"], "give 1")):
        with pytest.raises(ValueError, match=words):
            named_split(names, firsts, 2)
    with pytest.raises(ValueError):
        balanced_split([1.0, 1.0], 3)
    assert imbalance([3.0, 1.0]) == pytest.approx(1.5)


def test_layers_at_natural_boundaries_compose_to_the_model():
    torch.manual_seed(0)
    mlp = build_model("mlp", (1, 8, 8), 10, width=16, depth=3)
    assert [layer.name for layer in pipeline_layers(mlp)] == ["1", "3", "5", "7"]  # Flatten and ReLUs ride along
    net = build_model("resnet18", (3, 16, 16), 10, width=8).eval()
    layers = pipeline_layers(net)
    assert [layer.name for layer in layers][:3] == ["stem", "stages.0.0", "stages.0.1"] and layers[-1].name == "head"
    assert len(layers) == 1 + 8 + 1
    x = torch.randn(2, 3, 16, 16)
    y = x
    for layer in layers:
        y = layer.module(y)
    torch.testing.assert_close(y, net(x))

    class Net(nn.Module):  # not a Sequential: the user names its layers in forward order
        def __init__(self):
            super().__init__()
            self.embed, self.body, self.head = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.body(self.embed(x)))
    assert [layer.name for layer in pipeline_layers(Net(), ["embed", "body", "head"])] == ["embed", "body", "head"]
    with pytest.raises(TypeError, match="layers="):
        pipeline_layers(Net())


def test_auto_split_from_measured_layer_times_balances_a_planted_model():
    # One layer 4x heavier (planted sleeps): uniform puts it with another layer; the measurement cuts after it.
    # 40 ms forward (160 ms the heavy one), backward 2x: long enough that a loaded machine's late wake-ups
    # (tens of ms) do not hide the planted 4x.
    model = one_heavy((1, 8, 8), 10, width=10_000, depth=4)
    layers = pipeline_layers(model)
    costs = profile_layers(layers, torch.randn(4, 1, 8, 8), repeats=3, warmup=1)
    secs = [c.seconds for c in costs]
    assert secs[0] > 2 * max(secs[1:])  # planted 4x; a loaded machine wakes sleepers late, which narrows it
    auto, uniform = balanced_split(secs, 2), uniform_split(len(secs), 2)
    assert auto == [0, 1] and uniform == [0, 2]
    assert imbalance(stage_costs(secs, auto)) < imbalance(stage_costs(secs, uniform))
    assert costs[0].activation_bytes == 4 * 32 * 4 and costs[0].param_bytes == (64 * 32 + 32) * 4


def test_profiling_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    net = build_model("resnet18", (3, 16, 16), 10, width=8)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.randn(4, 3, 16, 16)
    rng = torch.get_rng_state()
    profile_layers(pipeline_layers(net), x, repeats=1, warmup=0)
    for k, v in net.state_dict().items():
        assert torch.equal(v, before[k]), k  # BatchNorm statistics restored
    assert all(p.grad is None for p in net.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
