"""A character-level language model (not classification), on trainscale's run API.

A small GRU learns to continue a text shipped with Python itself (the Zen of Python, from the standard
library's ``this`` module: nothing is downloaded). Batches are dicts, the loss is the user's own
(next-character cross-entropy over every position).

    trainscale launch --nproc-per-node 2 examples/char_lm.py --steps 300
    trainscale doctor --nproc 2 -- python examples/char_lm.py --slow-input-ms 1
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io

import torch
from torch import nn
from torch.utils.data import Dataset

import trainscale
from trainscale.data.delay import with_sample_delay


def corpus() -> str:
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints the Zen
        import this
    zen = codecs.decode(this.s, "rot13")
    return (zen + "\n") * 4


class Windows(Dataset):
    """Every window of ``length`` + 1 characters: the input and the same window shifted by one."""

    def __init__(self, text: str, vocab: dict[str, int], length: int):
        self.ids = torch.tensor([vocab[c] for c in text])
        self.length = length

    def __len__(self) -> int:
        return len(self.ids) - self.length - 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        w = self.ids[i:i + self.length + 1]
        return {"input": w[:-1], "target": w[1:]}


class CharGRU(nn.Module):
    def __init__(self, vocab: int, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, 64)
        self.rnn = nn.GRU(64, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.head(out)


def next_char_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--length", type=int, default=32, help="characters per window")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--slow-input-ms", type=float, default=0.0,
                   help="planted fault: a disk shared by this machine's processes, this slow per sample read")
    args, config = p.parse_known_args()  # the rest: --section.field VALUE for the run

    text = corpus()
    vocab = {c: i for i, c in enumerate(sorted(set(text)))}
    run = trainscale.init(args=config)
    model = CharGRU(len(vocab))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = Windows(text, vocab, args.length)
    if args.slow_input_ms:  # planted: one slow disk that every process of this machine reads from
        data = with_sample_delay(data, args.slow_input_ms, scope="node")
    model, optimizer, loader = run.prepare(model, optimizer, torch.utils.data.DataLoader(data, batch_size=args.batch_size))
    for batch in run.batches(loader, steps=args.steps):
        run.backward(next_char_loss(model(batch["input"]), batch["target"]))
        run.step()
    run.finish()
    if run.is_main:
        print(f"loss {run.summary['loss_first']:.3f} -> {run.summary['loss_last']:.3f} (uniform guess: "
              f"{torch.log(torch.tensor(float(len(vocab)))).item():.3f})")


if __name__ == "__main__":
    main()
