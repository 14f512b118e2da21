"""A character-level GPT trained the way nanoGPT's ``train.py`` trains one, on trainscale's run API.

The model has nanoGPT's shape: token and position embeddings, pre-LayerNorm blocks of causal self-attention
(``scaled_dot_product_attention``) and a GELU MLP, a final LayerNorm and an output layer tied to the token
embedding. The loop is nanoGPT's: AdamW with decay and no-decay groups, linear warm-up then cosine decay of
the learning rate set by hand at every optimizer step, gradient accumulation over micro-steps of its own
(``run.no_sync()`` on all but the last), clipping (``run.clip_gradients``), mixed precision (bf16 autocast on a
CPU that multiplies bf16 natively, fp16 with a loss scaler on CUDA, through ``--strategy.amp``), an optional
``torch.compile``, a validation loss of its own averaged over the ranks (``run.all_reduce``) and a sample printed
at the end.

The text is generated at start-up, the same on every rank: sentences of a small seeded grammar (subjects,
verbs, objects, places, and sums like ``3 plus 4 is 7``), so the validation loss falls visibly within a minute
on 2 CPU processes.

    trainscale launch --nproc-per-node 2 examples/gpt.py
    trainscale launch --nproc-per-node 2 examples/gpt.py --compile
    trainscale doctor --nproc 2 -- python examples/gpt.py --eval-batches 4
    trainscale doctor --nproc 2 -- python examples/gpt.py --eval-batches 4 --slow-input-ms 2   # a planted fault
    trainscale bench --nproc 1,2 -- python examples/gpt.py --eval-batches 4

The run summary carries the model FLOPs per step and the MFU (``flops_per_step``, ``mfu``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import trainscale
from trainscale.data.delay import with_sample_delay
from trainscale.train.instruments.peak import bf16_native

# ---------------------------------------------------------------- the text


SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "a small bird", "the teacher", "our team", "a farmer"]
VERBS = ["sees", "likes", "finds", "chases", "helps", "paints", "follows", "calls"]
OBJECTS = ["the ball", "a red box", "the river", "an apple", "the moon", "a letter", "the green door", "a song"]
PLACES = ["in the park", "at home", "by the sea", "after lunch", "every day", "at night"]


def sentence(rng: random.Random) -> str:
    """One sentence of the grammar: a clause (sometimes two, joined), or a sum with its right answer."""
    if rng.random() < 0.25:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"{a} plus {b} is {a + b}."
    clause = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    if rng.random() < 0.5:
        clause += f" {rng.choice(PLACES)}"
    if rng.random() < 0.2:
        clause += f" and {rng.choice(VERBS)} {rng.choice(OBJECTS)}"
    return clause + "."


def make_text(chars: int, seed: int) -> str:
    """About ``chars`` characters of the grammar's sentences, five to a line."""
    rng, lines = random.Random(seed), []
    while sum(len(line) + 1 for line in lines) < chars:
        lines.append(" ".join(sentence(rng) for _ in range(5)))
    return "\n".join(lines) + "\n"


class Windows(Dataset):
    """Every window of ``block`` + 1 tokens: the input and the same window shifted by one."""

    def __init__(self, ids: torch.Tensor, block: int):
        self.ids, self.block = ids, block

    def __len__(self) -> int:
        return len(self.ids) - self.block - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.ids[i:i + self.block + 1]
        return w[:-1], w[1:]


# ---------------------------------------------------------------- the model


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """nanoGPT's model: ``forward(ids)`` returns the next-token logits at every position."""

    def __init__(self, vocab: int, block: int, layers: int = 4, heads: int = 4, d: int = 128, dropout: float = 0.0):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying: one matrix embeds tokens and scores them
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, new: int, temperature: float = 0.8, top_k: int = 10,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """``ids`` followed by ``new`` sampled tokens (top-k, at ``temperature``)."""
        for _ in range(new):
            logits = self(ids[:, -self.block:])[:, -1, :].float() / temperature
            v, _ = torch.topk(logits, min(top_k, logits.shape[-1]))
            logits[logits < v[:, [-1]]] = -float("inf")
            ids = torch.cat([ids, torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)], dim=1)
        return ids


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's groups: matrices (2-D and up) decay; biases and LayerNorm weights do not."""
    params = [p for p in model.parameters() if p.requires_grad]  # the tied matrix once
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def lr_at(step: int, steps: int, peak: float, warmup: int, floor: float) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` optimizer steps, then cosine decay to ``floor`` at ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * progress))


def next_token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# ---------------------------------------------------------------- the loop


@torch.no_grad()
def validation_loss(run: trainscale.Run, model: nn.Module, val: Windows, batches: int, batch_size: int) -> float:
    """Mean next-token loss over ``batches`` fixed validation batches, split over the ranks (exact: sums added)."""
    model.eval()  # the prepared model then runs the module directly: no DDP, no collective in forward
    g = torch.Generator().manual_seed(1234)  # the same batches every time, on every rank
    starts = torch.randint(len(val), (batches, batch_size), generator=g)
    total = torch.zeros(2, dtype=torch.float64, device=run.device)  # (sum of batch losses, batches)
    for i in range(run.env.rank, batches, run.env.world_size):
        x, y = (torch.stack(t).to(run.device) for t in zip(*(val[int(j)] for j in starts[i])))
        total += torch.stack([next_token_loss(model(x), y).double(), torch.ones((), device=run.device).double()])
    run.all_reduce(total)  # over every rank: each batch counted once
    model.train()
    return (total[0] / total[1]).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Any other --section.field VALUE argument configures the run "
                                       "(trainscale train --print-config lists them).")
    p.add_argument("--steps", type=int, default=120, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per micro-step and process")
    p.add_argument("--accum", type=int, default=2, help="micro-steps per optimizer step (the script's own loop)")
    p.add_argument("--block", type=int, default=64, help="context length, in characters")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128, help="embedding width")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--lr", type=float, default=3e-3, help="the peak learning rate")
    p.add_argument("--min-lr", type=float, default=3e-4, help="the learning rate at the end of the cosine")
    p.add_argument("--warmup", type=int, default=10, help="optimizer steps of linear warm-up")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-norm", type=float, default=1.0, help="clip the gradient norm to this (0: no clipping)")
    p.add_argument("--eval-every", type=int, default=0, help="validation every N steps (0: at the start and end)")
    p.add_argument("--eval-batches", type=int, default=16, help="validation batches, split over the ranks")
    p.add_argument("--chars", type=int, default=200_000, help="characters of generated training text")
    p.add_argument("--sample", type=int, default=200, help="characters sampled at the end (0: none)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model before run.prepare")
    p.add_argument("--slow-input-ms", type=float, default=0.0,
                   help="planted fault for the doctor: a disk shared by this machine's processes, this slow per "
                        "sequence read")
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run
    for name in ("steps", "batch_size", "accum", "block", "layers", "heads", "width", "eval_batches", "chars"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be >= 1")
    if args.width % args.heads:
        p.error(f"--width {args.width} must be a multiple of --heads {args.heads}")
    if args.slow_input_ms < 0:
        p.error(f"--slow-input-ms = {args.slow_input_ms}: must be >= 0")
    if args.compile:
        check_compiler()  # before any process group: a torch that cannot compile stops here, with one line

    text = make_text(args.chars, seed=0)
    held_out = make_text(args.chars // 10, seed=1)  # other sentences of the same grammar
    chars = sorted(set(text + held_out))
    stoi = {c: i for i, c in enumerate(chars)}
    train = Windows(torch.tensor([stoi[c] for c in text]), args.block)
    val = Windows(torch.tensor([stoi[c] for c in held_out]), args.block)

    run = trainscale.init(args=["--strategy.amp", default_amp(), *config])  # the command line's own choice wins
    model = GPT(len(chars), args.block, args.layers, args.heads, args.width, args.dropout)
    optimizer = torch.optim.AdamW(param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    data = with_sample_delay(train, args.slow_input_ms, scope="node")  # the dataset itself when no delay
    loader = DataLoader(data, batch_size=args.batch_size * args.accum, shuffle=True)  # K micro-batches at once
    if args.compile:
        # Before prepare (docs/run-api.md): one graph on one process, the graph cut at DDP's buckets on several,
        # and the loss under the forward's autocast region, nothing cast back.
        model = torch.compile(model)
    model, optimizer, loader = run.prepare(model, optimizer, loader)
    raw = model  # the prepared model: state_dict, eval, generate
    if run.is_main:
        n = sum(q.numel() for q in raw.parameters())
        print(f"GPT: {n / 1e6:.2f} M parameters, vocabulary {len(chars)}, context {args.block}; "
              f"{len(text):,} training characters", flush=True)

    t0 = time.perf_counter()
    with run.untimed():
        before = validation_loss(run, model, val, args.eval_batches, args.batch_size)
    first_eval_s, first_steps = time.perf_counter() - t0, []
    t0 = t_step = time.perf_counter()
    for x, y in run.batches(loader, steps=args.steps):
        lr = lr_at(run.step_count, run.total_steps, args.lr, args.warmup, args.min_lr)  # once per optimizer step
        for group in optimizer.param_groups:
            group["lr"] = lr
        micro = list(zip(x.chunk(args.accum), y.chunk(args.accum)))
        for i, (xm, ym) in enumerate(micro):
            # DDP exchanges gradients only in the last micro-step's backward (nanoGPT's require_backward_grad_sync).
            with run.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
                run.backward(next_token_loss(model(xm), ym) / len(micro))
        if args.max_norm > 0:
            run.clip_gradients(args.max_norm)  # unscaled under fp16; after the exchange; the whole model's norm
        run.step()
        if len(first_steps) < 3:  # with --compile: the training graph's compile time is in these
            first_steps.append(time.perf_counter() - t_step)
            t_step = time.perf_counter()
        if args.eval_every and run.step_count % args.eval_every == 0 and run.step_count < run.total_steps:
            with run.untimed():
                loss = validation_loss(run, model, val, args.eval_batches, args.batch_size)
            if run.is_main:
                print(f"step {run.step_count}: validation loss {loss:.3f}", flush=True)
    train_s = time.perf_counter() - t0
    with run.untimed():
        after = validation_loss(run, model, val, args.eval_batches, args.batch_size)
        if args.sample:  # on every rank, before finish(): under strategy.fsdp each forward all-gathers
            raw.eval()
            # A full context of held-out text, then a sliding window: one input shape (a new one costs CPU
            # kernels a set-up each). One generator seed: every rank draws the same characters.
            prompt = val.ids[:args.block].unsqueeze(0).to(run.device)
            g = torch.Generator(device=run.device).manual_seed(0)
            sample = raw.module.generate(prompt, args.sample, generator=g)[0, args.block:].tolist()
    summary = run.finish()
    if run.is_main:
        print(f"validation loss {before:.3f} -> {after:.3f} in {run.step_count} steps, {train_s:.1f} s "
              f"(uniform guess: {math.log(len(chars)):.3f})")
        if args.compile:
            print(f"compiled: first validation {first_eval_s:.1f} s, first steps "
                  f"{', '.join(f'{t:.1f}' for t in first_steps)} s (they include the graphs' compile)")
        if summary.get("mfu") is not None:
            print(f"model FLOPs per step {summary['flops_per_step']:.3g}, MFU {summary['mfu']:.1%} "
                  f"(peak {summary['peak_flops_source']})")
        if args.sample:
            print("sample: " + "".join(chars[i] for i in sample).replace("\n", " / "))


def default_amp() -> str:
    """fp16 autocast with a scaler on CUDA; on a CPU bf16 only where it multiplies bf16 natively (AVX-512 BF16,
    AMX): elsewhere (an AVX2 host) bf16 is emulated and slower than fp32, so fp32."""
    if torch.cuda.is_available():
        return "fp16"
    return "bf16" if bf16_native(torch.device("cpu")) else "none"


def check_compiler() -> None:
    """Compile a tiny function on this device; without a working compiler, one line and exit 2.

    Compiling is lazy (the model compiles in its first steps), so this trial is what fails early: no C++
    compiler for the CPU backend, no Triton for CUDA, a Python that dynamo does not support.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        torch.compile(lambda t: t * 2 + 1)(torch.ones(4, device=device))
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"examples/gpt.py: --compile: torch.compile does not work here: {first}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
