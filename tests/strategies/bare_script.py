"""One process, a tiny model: the plain PyTorch loop or the same loop on the run API; saves what a test compares.

    python tests/strategies/bare_script.py OUT.pt plain|run [compile]

Both loops take the same batches, accumulate two micro-steps (the run API's first under ``run.no_sync()``),
clip at a norm every step reaches, and step SGD with momentum. The run asks for one bucket per tensor
(``strategy.bucket_mb 0``): under a DDP wrapper a compiled model would be split into a graph per bucket. ``compile``: the model is ``torch.compile``d
(before ``run.prepare``) with a backend that counts the graphs dynamo hands it. OUT.pt holds the weights, the
graph count, the class of what the training forward ran through, and the run's summary fields.
"""

import contextlib
import sys

import torch

STEPS, K, MAX_NORM = 6, 2, 0.5
out, mode, compiled = sys.argv[1], sys.argv[2], "compile" in sys.argv[3:]
graphs = [0]
torch.set_num_threads(1)  # the run's --job.threads 1: the same kernels on both sides


def counting_backend(gm, example_inputs):
    graphs[0] += 1
    return gm.forward


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return torch.compile(model, backend=counting_backend) if compiled else model


g = torch.Generator().manual_seed(1)
batches = [(torch.randn(8, 8, generator=g), torch.randint(4, (8,), generator=g)) for _ in range(STEPS)]
loss_fn = torch.nn.functional.cross_entropy
saved = {}
if mode == "plain":
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        for xm, ym in zip(x.chunk(K), y.chunk(K)):
            loss_fn(model(xm), ym).div(K).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        opt.zero_grad(set_to_none=True)
    saved["ran_through"] = type(model).__name__
else:
    import trainscale
    from trainscale.strategies.ddp import is_compiled

    run = trainscale.init(args=["--log.progress", "none", "--job.threads", "1", "--strategy.bucket_mb", "0"])
    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, opt, _ = run.prepare(model, opt)
    norms = []
    for x, y in run.batches(iter(batches), steps=STEPS):
        for i, (xm, ym) in enumerate(zip(x.chunk(K), y.chunk(K))):
            with run.no_sync() if i < K - 1 else contextlib.nullcontext():
                run.backward(loss_fn(model(xm), ym).div(K))
        norms.append(float(run.clip_gradients(MAX_NORM)))
        run.step()
    saved["ran_through"] = type(run.strategy.model).__name__
    saved["wrapped"] = run.strategy.model is not run.strategy.module
    saved["seen_compiled"] = is_compiled(run.strategy.module)
    saved["min_norm"] = min(norms)
    summary = run.finish()
    saved.update({k: summary.get(k) for k in ("layout", "allreduce_calls_per_step", "comm_bytes_per_step")})
saved["graphs"] = graphs[0]
saved["weights"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
torch.save(saved, out)
