"""A Hugging Face ``Trainer`` script on a tiny GPT-2 built from its config (no download; run it under torchrun).

No trainscale import. Fault switches for trainscale's tests: ``--slow-collate-ms 20`` (a Python collate,
no workers), ``--slow-rank 1`` (that rank's forward 3x slower). ``--cuda`` trains on the GPU (ranks may share
one: the Trainer's exchange then runs on Gloo, as NCCL wants one GPU per rank). ``--eval-every N`` evaluates on a
held-out set every N steps (``--eval-collate-ms`` slows its batches).

    HF_HUB_OFFLINE=1 torchrun --nproc-per-node 2 hf_train.py --steps 40
"""

import argparse
import functools
import os
import tempfile
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, length, vocab):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--slow-collate-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--cuda", action="store_true")
    p.add_argument("--accum", type=int, default=1, help="gradient_accumulation_steps")
    p.add_argument("--eval-every", type=int, default=0, help="eval_steps: evaluate on a held-out set every N steps")
    p.add_argument("--eval-collate-ms", type=float, default=0.0, help="the collate sleeps this for a held-out batch")
    args = p.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=2, n_head=4)
    model = GPT2LMHeadModel(config)
    if int(os.environ.get("RANK", "0")) == args.slow_rank:
        forward = model.forward

        @functools.wraps(forward)  # keeps forward's signature, from which the Trainer picks the batch's columns
        def slow_forward(*a, **kw):
            t = time.perf_counter()
            out = forward(*a, **kw)
            time.sleep((time.perf_counter() - t) * 2)
            return out
        model.forward = slow_forward

    eval_batch = 128  # the Trainer has one collate: a held-out batch is told by its size

    def collate(samples):
        time.sleep((args.eval_collate_ms if len(samples) == eval_batch else args.slow_collate_ms) / 1000)
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}

    out = tempfile.mkdtemp(prefix="hf_train_")
    training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
                                 gradient_accumulation_steps=args.accum,
                                 learning_rate=1e-3, use_cpu=not args.cuda,
                                 ddp_backend="gloo" if args.cuda else None, report_to=[], save_strategy="no",
                                 logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True, seed=0,
                                 eval_strategy="steps" if args.eval_every else "no", eval_steps=args.eval_every or None,
                                 per_device_eval_batch_size=eval_batch)
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(2048, 32, 256), data_collator=collate,
                      eval_dataset=Tokens(512, 32, 256) if args.eval_every else None)
    trainer.train()


if __name__ == "__main__":
    main()
