#!/usr/bin/python3
"""gloo_allreduce.py - PyTorch's Gloo allreduce timed like `dtrain bench allreduce`, printing the
same JSON rows (bytes, count, dtype, time_us, algbw_gbs, busbw_gbs, wrong), for bench/compare-peers.

`gloo_allreduce.py -n N --sizes B1,B2,... [--iters I] [--warmup W]` starts N local processes
(this script again, with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set as torchrun would) that join
one gloo process group over loopback (GLOO_SOCKET_IFNAME=lo; Gloo has no shared-memory transport).
Per size: `warmup` untimed calls, then `iters` timed dist.all_reduce calls, each after a barrier
and timed on every rank; per call the slowest rank's time counts and the row gives the median over
the calls (what `dtrain bench` does). all_reduce works in place, so the timed calls reduce
their own growing output (still plain float adds); afterwards the tensor is refilled with small
integers and one more call is checked exactly; `wrong` counts wrong elements over all ranks.
--fresh refills the tensor before every timed call, untimed (as `dtrain bench --fresh`).

It deliberately does only what a PyTorch user writes (dist.all_reduce on a CPU float32 tensor,
default Gloo algorithm); it does not cover the other collectives (Gloo in torch 1.13 has no
reduce_scatter). Rank 0 prints the JSON array on stdout; everything else goes to stderr.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402


def input_values(torch, rank, count):
    """Element i of rank r: (7i + 13r) mod 17 + 1, as bench/mpi_coll.c; built from its period of 17
    so that 64M-element inputs take milliseconds, not seconds."""
    period = ((torch.arange(17, dtype=torch.int64) * 7 + rank * 13) % 17 + 1).to(torch.float32)
    return period.repeat((count + 16) // 17)[:count].contiguous()


def worker(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    n = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=n)
    rows = []
    for nbytes in args.sizes:
        count = nbytes // 4
        if count == 0:
            continue
        t = input_values(torch, rank, count)
        for _ in range(args.warmup):
            dist.all_reduce(t)
        times = torch.zeros(args.iters, dtype=torch.float64)
        base = t.clone() if args.fresh else None
        for it in range(args.iters):
            if args.fresh:
                dist.barrier()  # every rank out of the last call before any refills
                t.copy_(base)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times[it] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        slowest = statistics.median(times.tolist())

        t = input_values(torch, rank, count)
        dist.all_reduce(t)
        want = torch.zeros(count, dtype=torch.float32)
        for r in range(n):
            want += input_values(torch, r, count)
        wrong = torch.tensor([int((t != want).sum().item())], dtype=torch.int64)
        dist.all_reduce(wrong)
        del t, want
        b = count * 4
        algbw = b / slowest / 1e9
        rows.append({"bytes": b, "count": count, "dtype": "f32", "time_us": round(slowest * 1e6, 3),
                     "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                     "wrong": int(wrong.item()), "iters": args.iters, "ranks": n})
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.n), GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    procs = []
    for r in range(args.n):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--sizes",
               ",".join(map(str, args.sizes)), "--iters", str(args.iters), "--warmup", str(args.warmup)] \
            + (["--fresh"] if args.fresh else [])
        procs.append(subprocess.Popen(cmd, env=dict(env, RANK=str(r)),
                                      stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL))
    out = benchlib.wait_ranks(procs, args.timeout, "gloo_allreduce")
    sys.stdout.write(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=2, help="ranks (processes)")
    ap.add_argument("--sizes", required=True, help="comma-separated byte counts")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=-1, help="default: iters/10 in 1..20")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--fresh", action="store_true", help="refill the tensor before every call, untimed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    if args.warmup < 0:
        args.warmup = min(20, max(1, args.iters // 10))
    if args.iters < 1 or args.n < 1:
        sys.exit("gloo_allreduce: -n and --iters must be >= 1")
    if args.worker:
        worker(args)
    else:
        launch(args)


if __name__ == "__main__":
    main()
