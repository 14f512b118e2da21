"""The run API's step is the user's own step, op for op: a CPU check that sees what a GPU would pay for.

``step_ops_job.py`` records one steady-state step of a nanoGPT-shaped model under bf16 autocast, for a plain
PyTorch loop and for the run API, at world size 1 (plain: the bare model) and 2 (Gloo; plain: a hand-written DDP
loop). On a CPU a cast of the logits or a gradient-bucket copy hides inside the compute; here it shows as an op the
plain step does not have, with the bytes it writes. The run's step may add O(1) bookkeeping (its loss window),
nothing that scales with the model or its output, no host sync (not even at a log point), and not one FLOP.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from clitools import run_cli

JOB = Path(__file__).parent / "step_ops_job.py"
BIG_OP = 1 << 20  # an extra op that writes this much is a cost that scales with the model or its output
EXTRA_SHARE = 0.005  # the run's extra bytes, at most this share of the plain step's
SYNC_OPS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "_unique2",
            "unique_consecutive", "unique_dim", "allclose"}  # ops whose result the host must wait for
pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

_records: dict[int, dict[str, Any]] = {}


def records(tmp_path_factory: pytest.TempPathFactory, world: int) -> dict[str, Any]:
    """The job's records at ``world`` processes (launched once per world size for the module's tests)."""
    if world not in _records:
        out = tmp_path_factory.mktemp(f"ops{world}") / "ops.json"
        r = run_cli(["launch", "--nproc-per-node", str(world), str(JOB), str(out)], timeout=240)
        assert r.rc == 0, r.text[-3000:]
        _records[world] = json.loads(out.read_text())
    return _records[world]


def extras(plain: list[list[Any]], run: list[list[Any]]) -> list[tuple[str, Any, Any, int]]:
    """The run's ops (name, shapes, dtypes) beyond the plain step's, each with the bytes it writes."""
    def key(op: list[Any]) -> tuple[str, str, str, int]:
        return op[0], json.dumps(op[1]), json.dumps(op[2]), op[3]

    more = Counter(map(key, run)) - Counter(map(key, plain))
    return [(name, json.loads(shapes), json.loads(dtypes), written) for (name, shapes, dtypes, written), n
            in more.items() for _ in range(n)]


def syncs(ops: list[list[Any]]) -> int:
    return sum(op[0].split(".", 1)[1] in SYNC_OPS for op in ops)


def describe(ops: list[tuple[str, Any, Any, int]]) -> str:
    top = sorted(ops, key=lambda o: -o[3])[:8]
    return "; ".join(f"{name} {shapes} {dtypes} {written / 1e6:.3f} MB" for name, shapes, dtypes, written in top)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("form", ["nanogpt", "readme"])
def test_the_run_step_has_no_op_the_plain_step_does_not_have(tmp_path_factory, world, form):
    rec = records(tmp_path_factory, world)
    plain, run = rec[f"plain/{form}"]["ops"], rec[f"run/{form}"]["ops"]
    more = extras(plain, run)
    total, extra = sum(op[3] for op in plain), sum(op[3] for op in more)
    print(f"world {world}, {form}: plain step {len(plain)} ops, {total / 1e6:.2f} MB written; run step "
          f"{len(run)} ops, {len(more)} extra writing {extra / 1e6:.3f} MB ({extra / total:.2%}): {describe(more)}")
    big = [op for op in more if op[3] >= BIG_OP]
    assert not big, f"the run's step has ops the plain step does not have, >= 1 MB each: {describe(big)}"
    assert extra <= EXTRA_SHARE * total, (f"the run's step writes {extra / total:.2%} more bytes than the plain "
                                          f"step's {total / 1e6:.2f} MB: {describe(more)}")


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("form", ["nanogpt", "readme"])
def test_the_run_step_has_no_host_sync_and_the_plain_flops(tmp_path_factory, world, form):
    rec = records(tmp_path_factory, world)
    plain, run = rec[f"plain/{form}"], rec[f"run/{form}"]
    # The recorded step is a log point: the loss window of the one before is read from the host copy it left.
    waits, plain_waits = syncs(run["ops"]), syncs(plain["ops"])
    assert waits <= plain_waits, f"the run's step makes the host wait for the device {waits} times, the plain " \
                                 f"step {plain_waits}"
    assert run["flops"] == plain["flops"] > 0


@pytest.mark.parametrize("world", [1, 2])
def test_the_loss_keeps_the_plain_amp_recipes_dtype_and_value(tmp_path_factory, world):
    rec = records(tmp_path_factory, world)
    for form in ("nanogpt", "readme"):
        plain, run = rec[f"plain/{form}"], rec[f"run/{form}"]
        assert run["loss_dtype"] == plain["loss_dtype"] == "float32", form  # cross_entropy: autocast's fp32 list
        assert run["losses"] == pytest.approx(plain["losses"], rel=1e-6, abs=0), form


@pytest.mark.parametrize("world", [1, 2])
def test_a_compiled_model_compiles_as_many_graphs_as_the_plain_loop(tmp_path_factory, world):
    rec = records(tmp_path_factory, world)
    plain, run = rec["plain/compiled"], rec["run/compiled"]
    assert run["graphs"] == plain["graphs"] > 0
    assert run["losses"] == pytest.approx(plain["losses"], rel=1e-6, abs=0)
