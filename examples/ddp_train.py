"""Train an OELM model with DistributedDataParallel, then check that the ranks agree.

OELM freezes tensors (``requires_grad=False``); DDP only registers gradient hooks for parameters
that require grad, so it needs no ``find_unused_parameters=True`` (which would cost an extra
graph traversal every step): every trainable parameter gets a gradient in every step. Launch::

    OMP_NUM_THREADS=1 OELM_DATA_DIR=../shared/data \\
        torchrun --nproc_per_node=2 examples/ddp_train.py --model bert --steps 10 --summary out/ddp.json

(``torchrun`` is ``python -m torch.distributed.run``; add ``--master_port=<free port>`` when
several jobs share a machine.) Each rank builds the same model from the same seed, applies the
OELM method, and reads a disjoint shard of real SST-2 sentences through a
``DistributedSampler``. The backend is gloo on CPU, nccl on GPUs.

After training every rank all-gathers a sha256 per parameter; rank 0 checks that all ranks hold
identical parameters, that every frozen tensor is bit-identical to its value before training, that
every trainable tensor changed, and that the ranks read different sentences. It writes a JSON
summary (``--summary``), saves a lean checkpoint (``--save-dir``, rank 0 only, with
``oelm.save_pretrained``), and exits with status 1 if a check failed.

Models (``--model``): ``bert`` (a small BertForSequenceClassification, hidden 32, 2 layers, with
the real bert-base-uncased WordPiece vocabulary from ``<data dir>/tokenizers``) or ``gpt``
(oelm's ``gpt-tiny`` shrunk to 2 layers, GPT-2 BPE tokenizer).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

import oelm
from oelm.checkpoint import tensor_sha256
from oelm.data import classification_collator, encode_classification, load_classification, resolve_data_dir, subsample
from oelm.io import write_json_atomic


def build_model_and_tokenizer(kind: str, seed: int, data_dir: str | None = None):
    """The same fresh model on every rank (``torch.manual_seed(seed)``), and its real tokenizer.

    Raises:
        oelm.ConfigError: unknown ``kind``.
        oelm.DataNotFoundError: the tokenizer files are not under ``<data dir>/tokenizers``.
    """
    root = resolve_data_dir(data_dir)
    if kind == "bert":
        from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

        folder = Path(root or "") / "tokenizers" / "bert-base-uncased"
        if not (folder / "vocab.txt").is_file():
            raise oelm.DataNotFoundError(f"{folder}/vocab.txt not found; set OELM_DATA_DIR to a folder laid out like shared/data")
        # from_pretrained on the folder: in transformers 5, BertTokenizerFast(vocab_file=...) ignores the file.
        tokenizer = BertTokenizerFast.from_pretrained(str(folder))
        torch.manual_seed(seed)
        config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=128, num_labels=2)
        return BertForSequenceClassification(config), tokenizer
    if kind == "gpt":
        from oelm.data import load_gpt2_tokenizer
        from oelm.models.gpt import build_gpt

        tokenizer = load_gpt2_tokenizer(data_dir)
        torch.manual_seed(seed)
        model = build_gpt("gpt-tiny", "sequence_classification", vocab_size=50304, num_layers=2, hidden_size=64,
                          intermediate_size=128, context_length=128, pad_token_id=tokenizer.pad_token_id)
        return model, tokenizer
    raise oelm.ConfigError(f"--model must be 'bert' or 'gpt', got {kind!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert", choices=["bert", "gpt"])
    p.add_argument("--method", default="oelm_freeze", help=f"one of {', '.join(oelm.METHODS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--train-size", type=int, default=320, help="SST-2 training sentences shared out among the ranks")
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--data-dir", default=None, help="folder laid out like shared/data (default $OELM_DATA_DIR)")
    p.add_argument("--summary", default=None, help="JSON summary written by rank 0")
    p.add_argument("--save-dir", default=None, help="lean OELM checkpoint written by rank 0")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")

    model, tokenizer = build_model_and_tokenizer(args.model, args.seed, args.data_dir)
    report = oelm.apply_oelm(model, args.method, seed=args.seed)
    model.to(device)
    initial = {n: tensor_sha256(p) for n, p in model.named_parameters()}
    frozen = sorted(n for n, p in model.named_parameters() if not p.requires_grad)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if use_cuda else None)  # find_unused_parameters=False

    df = subsample(load_classification("sst2", "train", args.data_dir), args.train_size, seed=args.seed)
    dataset = encode_classification(df, tokenizer, ("text",), max_length=64)
    ids = [i for row in dataset.encodings["input_ids"] for i in row]
    unk_share = sum(i == tokenizer.unk_token_id for i in ids) / len(ids)
    if unk_share > 0.05:
        raise oelm.DataFormatError(f"{unk_share:.0%} of the tokens are unknown: the tokenizer did not load its vocabulary")
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, collate_fn=classification_collator(tokenizer))
    optimizer = torch.optim.AdamW([p for p in ddp.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay)

    ddp.train()
    step, epoch, losses, seen = 0, 0, [], []
    while step < args.steps:
        sampler.set_epoch(epoch)
        seen.extend(list(iter(sampler)))
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = ddp(**batch).loss
            loss.backward()  # DDP averages the gradients of trainable parameters across ranks here
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            losses.append(mean_loss.item() / world)
            step += 1
            if step == args.steps:
                break
        epoch += 1

    final = {n: tensor_sha256(p) for n, p in model.named_parameters()}
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "hashes": final, "indices": sorted(set(seen))})

    ok = True
    if rank == 0:
        failures = []
        for other in gathered[1:]:
            differ = sorted(n for n in final if other["hashes"][n] != final[n])
            if differ:
                failures.append(f"rank {other['rank']} differs from rank 0 in {len(differ)} parameter(s), e.g. {differ[:3]}")
        moved = [n for n in frozen if final[n] != initial[n]]
        if moved:
            failures.append(f"frozen tensor(s) changed: {moved[:3]}")
        unchanged = [n for n in final if n not in frozen and final[n] == initial[n]]
        if unchanged:
            failures.append(f"trainable tensor(s) did not change: {unchanged[:3]}")
        shards = [set(g["indices"]) for g in gathered]
        overlap = set.intersection(*shards) if len(shards) > 1 else set()
        if overlap:
            failures.append(f"ranks read the same examples: {sorted(overlap)[:5]}")
        if not all(map(lambda x: x == x, losses)):
            failures.append("a loss was NaN")
        saved = None
        if args.save_dir:
            saved = oelm.save_pretrained(ddp, args.save_dir)
        summary = {
            "ok": not failures,
            "failures": failures,
            "world_size": world,
            "backend": dist.get_backend(),
            "model": args.model,
            "method": args.method,
            "seed": args.seed,
            "steps": step,
            "losses": losses,
            "trainable": report.trainable,
            "total": report.total,
            "frozen_tensors": frozen,
            "find_unused_parameters": ddp.find_unused_parameters,
            "examples_per_rank": [len(s) for s in shards],
            "unk_share": unk_share,
            "final_sha256": final,
            "checkpoint_bytes": saved.bytes_written if saved else None,
            "full_checkpoint_bytes": saved.full_bytes if saved else None,
        }
        if args.summary:
            write_json_atomic(args.summary, summary)
        print(f"rank 0: {'OK' if not failures else 'FAILED'} after {step} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
              f"{len(frozen)} frozen tensors bit-identical: {not moved}; ranks in sync: {not any('differs' in f for f in failures)}")
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        ok = not failures
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
