#!/usr/bin/python3
"""torch_ddp.py - the PyTorch side of bench/ddp-vs-pytorch: DistributedDataParallel (gloo) on N
local processes, same models, data and recipe as torch_train.py, printing one JSON summary.

  torch_ddp.py -n 2 --model mlp|cnn [--epochs 1] [--batch 128] [--lr L] [--threads 1] [--max-steps N]

--batch is the global batch: every epoch all ranks draw the same seeded permutation, and rank r
trains on its 1/n share of each global batch, as DistributedSampler does with a global shuffle.
The processes are this script again with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun
would (GLOO_SOCKET_IFNAME=lo). Rank 0 measures throughput as torch_train.py does (10-step intervals;
its steps are in lock-step with the others through the gradient allreduce) and, after training, evaluates the model on the whole test set.

The model is initialized as dtrain initializes it (torch_train.init_like_dtrain: He/Kaiming normal,
fan_in, ReLU gain for a linear or conv layer followed by a ReLU, Glorot uniform for the last
linear layer, zero biases), not with PyTorch's default, so that accuracy compares the engines.
It deliberately keeps DDP's defaults (25 MB buckets, overlap of allreduce with backward).
"""
import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train as tt  # noqa: E402
import benchlib  # noqa: E402


def worker(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dist.init_process_group("gloo", rank=rank, world_size=n)
    xtr, ytr = tt.to_tensors(torch, *tt.load_split(args.data, "train"), args.model)
    model = DDP(tt.build_model(torch, args.model))  # broadcasts rank 0's parameters
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)
    rates, epoch_s = tt.IntervalRates(), []
    samples, steps, train_s = 0, 0, 0.0
    dist.barrier()
    for epoch in range(args.epochs):
        perm = torch.randperm(xtr.shape[0], generator=gen)  # identical on every rank
        starts = list(range(0, xtr.shape[0], args.batch))
        if args.max_steps:
            starts = starts[:args.max_steps]
        t_epoch = time.perf_counter()
        rates.restart()
        for k, i in enumerate(starts):
            gidx = perm[i:i + args.batch]
            per = (gidx.shape[0] + n - 1) // n
            idx = gidx[rank * per:(rank + 1) * per]
            if idx.shape[0] == 0:  # a tiny last batch: repeat a sample so every rank steps
                idx = gidx[-1:]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            rates.step(int(gidx.shape[0]), epoch_end=k == len(starts) - 1)
            samples += int(gidx.shape[0])
            steps += 1
        dist.barrier()
        dt = time.perf_counter() - t_epoch
        epoch_s.append(dt)
        train_s += dt
        if rank == 0:
            print(f"torch_ddp: epoch {epoch + 1}/{args.epochs}: {dt:.2f} s, last loss {float(loss):.4f}",
                  file=sys.stderr)
    if rank == 0:
        xte, yte = tt.to_tensors(torch, *tt.load_split(args.data, "test"), args.model)
        acc, tloss = tt.evaluate(torch, model.module, xte, yte)
        med, p10, p90 = rates.summary()
        print(json.dumps({
            "system": "pytorch-ddp", "torch_version": torch.__version__, "model": args.model, "workers": n,
            "threads": torch.get_num_threads(), "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
            "test_accuracy": acc, "test_loss": tloss, "samples_per_s": samples / train_s if train_s else None,
            "steady_samples_per_s": med, "steady_samples_per_s_p10": p10, "steady_samples_per_s_p90": p90,
            "steps": steps, "epoch_s": epoch_s,
            "peak_rss_mb_rank0": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, argv):
    t_wall = time.perf_counter()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.n),
               GLOO_SOCKET_IFNAME="lo")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"] + argv,
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL)
             for r in range(args.n)]
    out = benchlib.wait_ranks(procs, args.timeout, "torch_ddp")
    summary = tt_json(out)
    summary["wall_s"] = time.perf_counter() - t_wall
    print(json.dumps(summary))


def tt_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"torch_ddp: rank 0 printed no summary: {text[-300:]!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=2, help="worker processes")
    ap.add_argument("--model", required=True, choices=["mlp", "cnn"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--lr", type=float, default=None, help="default 0.05 (mlp) / 0.02 (cnn)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=tt.DEFAULT_DATA)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    argv = [a for a in sys.argv[1:] if a != "--worker"]
    args = ap.parse_args()
    if args.lr is None:
        args.lr = 0.05 if args.model == "mlp" else 0.02
    if args.n < 1 or args.batch < args.n or args.threads < 1:
        sys.exit("torch_ddp: need -n >= 1, --batch >= n and --threads >= 1")
    if args.worker:
        worker(args)
    else:
        launch(args, argv)


if __name__ == "__main__":
    main()
