#!/usr/bin/python3
"""torch_train.py - the PyTorch side of bench/train-vs-pytorch: the same models, data and recipe as
`dtrain train`, trained by PyTorch on the CPU, printing a JSON summary with dtrain's keys.

  torch_train.py --model mlp|cnn [--epochs 1] [--batch 128] [--lr L] [--momentum 0.9]
                 [--threads T] [--seed 1] [--data DIR] [--max-steps N]

Models: mlp = 784-1024-1024-10 with ReLU; cnn = conv5x5 1->32 pad 2, ReLU, maxpool 2, conv5x5
32->64 pad 2, ReLU, maxpool 2, linear 3136->512, ReLU, linear 512->10. Initialization is
dtrain's (src/nn/model.c), not PyTorch's default, so that the comparison measures the engines and
not the starting point: a linear or conv layer followed by a ReLU gets He/Kaiming normal weights
(kaiming_normal_, mode fan_in, ReLU gain: std sqrt(2 / fan_in)), the last linear layer (no ReLU
after it) Glorot/Xavier uniform weights (xavier_uniform_, gain 1), and every bias is zero. Data: Fashion-MNIST IDX files (gzip) parsed here with gzip+struct+numpy, pixels
scaled to [0,1], no normalization, a seeded shuffle each epoch, the last partial batch kept.
Loss: softmax cross-entropy; optimizer: SGD with momentum. Throughput is measured the way
`dtrain train` measures it: the wall time of every interval of 10 steps (and of the last, shorter
interval of an epoch) gives a rate; `steady_samples_per_s` is the median of these rates without
the first interval (warm-up), with their 10th-90th percentiles; `samples_per_s` is the whole
run's training samples / training time (evaluation excluded). The summary also has the time per
epoch and the test accuracy and loss after the last epoch.

It deliberately uses plain eager PyTorch as a user would write it (no torch.compile, no
channels-last tuning, no DataLoader workers: the data is already in memory). Set threads the way
bench/train-vs-pytorch does: OMP_NUM_THREADS=T OPENBLAS_NUM_THREADS=T OMP_WAIT_POLICY=PASSIVE in
the environment (before torch starts) and --threads T (torch.set_num_threads).
"""
import argparse
import gzip
import json
import os
import resource
import struct
import sys
import time

DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
LOG_INTERVAL = 10  # steps per throughput interval, as dtrain train's default --log-interval


class IntervalRates:
    """Samples/s over intervals of LOG_INTERVAL steps, closed early at an epoch's end."""

    def __init__(self):
        self.rates, self.t0, self.samples, self.steps = [], time.perf_counter(), 0, 0

    def restart(self):
        self.t0, self.samples, self.steps = time.perf_counter(), 0, 0

    def step(self, samples, epoch_end=False):
        self.samples += samples
        self.steps += 1
        if self.steps == LOG_INTERVAL or epoch_end:
            dt = time.perf_counter() - self.t0
            if dt > 0:
                self.rates.append(self.samples / dt)
            self.restart()

    def summary(self):
        """(median, p10, p90) of the rates after the first interval."""
        r = sorted(self.rates[1:] if len(self.rates) > 1 else self.rates)
        if not r:
            return None, None, None

        def pct(q):
            k = (len(r) - 1) * q
            lo = int(k)
            hi = min(lo + 1, len(r) - 1)
            return r[lo] + (r[hi] - r[lo]) * (k - lo)
        return pct(0.5), pct(0.1), pct(0.9)


def read_idx(path):
    """An IDX file (gzip'd or raw) as a numpy array; exits with a clear message when it is not."""
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        sys.exit(f"torch_train: cannot read {path}: {e} (Debian package: dataset-fashion-mnist)")
    if len(data) < 4:
        sys.exit(f"torch_train: {path}: too short for an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        sys.exit(f"torch_train: {path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    want = int(np.prod(dims))
    if body.size != want:
        sys.exit(f"torch_train: {path}: dimensions {dims} need {want} bytes, the file has {body.size}")
    return body.reshape(dims)


def load_split(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    if x.shape[0] != y.shape[0]:
        sys.exit(f"torch_train: {split}: {x.shape[0]} images but {y.shape[0]} labels")
    return x, y


def to_tensors(torch, x, y, model):
    xt = torch.from_numpy(x.astype("float32") / 255.0)
    xt = xt.reshape(-1, 1, 28, 28) if model == "cnn" else xt.reshape(-1, 784)
    return xt.contiguous(), torch.from_numpy(y.astype("int64"))


def init_like_dtrain(torch, model):
    """Initializes a Sequential as dtrain's init_params does (src/nn/model.c): weights of a linear
    or conv layer followed by a ReLU He normal (std sqrt(2 / fan_in), fan_in = in features, or
    in channels x k x k), other weights Glorot uniform (bound sqrt(6 / (fan_in + fan_out))), biases
    zero. Draws from torch's global generator (seeded by --seed)."""
    nn = torch.nn
    mods = list(model)
    for i, m in enumerate(mods):
        if not isinstance(m, (nn.Linear, nn.Conv2d)):
            continue
        if i + 1 < len(mods) and isinstance(mods[i + 1], nn.ReLU):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        else:
            nn.init.xavier_uniform_(m.weight, gain=1.0)
        nn.init.zeros_(m.bias)
    return model


def build_model(torch, name):
    """The model with dtrain's initialization (init_like_dtrain)."""
    nn = torch.nn
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    elif name == "cnn":
        model = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 10))
    else:
        sys.exit(f"torch_train: unknown model '{name}' (mlp or cnn)")
    return init_like_dtrain(torch, model)


def evaluate(torch, model, xt, yt):
    model.eval()
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for i in range(0, xt.shape[0], 1000):
            out = model(xt[i:i + 1000])
            loss_sum += float(torch.nn.functional.cross_entropy(out, yt[i:i + 1000], reduction="sum"))
            correct += int((out.argmax(1) == yt[i:i + 1000]).sum())
    model.train()
    return correct / xt.shape[0], loss_sum / xt.shape[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, choices=["mlp", "cnn"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=None, help="default 0.05 (mlp) / 0.02 (cnn)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--max-steps", type=int, default=0, help="stop each epoch after N steps (smoke tests)")
    args = ap.parse_args()
    if args.epochs < 1 or args.batch < 1 or args.threads < 1:
        sys.exit("torch_train: --epochs, --batch and --threads must be >= 1")
    lr = args.lr if args.lr is not None else (0.05 if args.model == "mlp" else 0.02)

    t_wall = time.perf_counter()
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    xtr, ytr = to_tensors(torch, *load_split(args.data, "train"), args.model)
    xte, yte = to_tensors(torch, *load_split(args.data, "test"), args.model)
    model = build_model(torch, args.model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(args.seed)

    rates, epoch_s = IntervalRates(), []
    samples, steps = 0, 0
    train_s = 0.0
    for epoch in range(args.epochs):
        perm = torch.randperm(xtr.shape[0], generator=gen)
        starts = list(range(0, xtr.shape[0], args.batch))
        if args.max_steps:
            starts = starts[:args.max_steps]
        t_epoch = time.perf_counter()
        rates.restart()
        for k, i in enumerate(starts):
            idx = perm[i:i + args.batch]
            xb, yb = xtr[idx], ytr[idx]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            rates.step(int(idx.shape[0]), epoch_end=k == len(starts) - 1)
            samples += int(idx.shape[0])
            steps += 1
        dt = time.perf_counter() - t_epoch
        epoch_s.append(dt)
        train_s += dt
        print(f"torch_train: epoch {epoch + 1}/{args.epochs}: {dt:.2f} s, last loss {float(loss):.4f}",
              file=sys.stderr)
    acc, tloss = evaluate(torch, model, xte, yte)
    med, p10, p90 = rates.summary()
    print(json.dumps({
        "system": "pytorch", "torch_version": torch.__version__, "model": args.model,
        "threads": torch.get_num_threads(), "epochs": args.epochs, "batch": args.batch, "lr": lr,
        "test_accuracy": acc, "test_loss": tloss, "samples_per_s": samples / train_s if train_s else None,
        "steady_samples_per_s": med, "steady_samples_per_s_p10": p10, "steady_samples_per_s_p90": p90,
        "steps": steps, "epoch_s": epoch_s, "wall_s": time.perf_counter() - t_wall,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


if __name__ == "__main__":
    main()
