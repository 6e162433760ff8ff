"""benchlib.py - what the comparison benchmarks under bench/ share: installing their Debian
packages, building dtrain and the small C helpers, running children under a hard timeout,
describing the machine, and robust statistics (medians with min-max spread).

It deliberately holds no benchmark logic of its own; each bench/<name> script is readable alone.
Runs with Debian's /usr/bin/python3 (the interpreter python3-torch installs into).
"""
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")


class SideFailed(Exception):
    """One side of a comparison could not run; the message says which and why."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def is_root():
    return os.geteuid() == 0


def ensure_packages(pkgs, allow_install=True):
    """Installs the Debian packages that are missing (idempotent). Raises SystemExit naming the
    packages when they are missing and cannot be installed."""
    missing = []
    for p in pkgs:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            missing.append(p)
    if not missing:
        return
    if not allow_install:
        sys.exit(f"bench: missing Debian packages {' '.join(missing)} (run without --no-install, "
                 f"or: apt-get install {' '.join(missing)})")
    log(f"bench: installing {' '.join(missing)}")
    sudo = [] if is_root() else ["sudo"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (sudo + ["apt-get", "update", "-qq"],
                sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing):
        r = subprocess.run(["timeout", "900"] + cmd, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench: '{' '.join(cmd)}' failed (exit {r.returncode}):\n{r.stderr[-2000:]}")


def build_dtrain(build_dir):
    """Builds dtrain with scripts/setup (incremental: quick when up to date). Returns the path
    of the dtrain binary."""
    r = subprocess.run(["timeout", "1800", os.path.join(ROOT, "scripts", "setup"), build_dir],
                       cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: building dtrain with scripts/setup {build_dir} failed:\n{r.stderr[-3000:]}")
    exe = os.path.join(ROOT, build_dir, "dtrain") if not os.path.isabs(build_dir) else os.path.join(build_dir, "dtrain")
    if not os.access(exe, os.X_OK):
        sys.exit(f"bench: scripts/setup succeeded but {exe} is not there")
    return exe


def build_helper(name, compiler, sources, flags, libs, build_dir, deps=()):
    """Compiles bench/<sources> into <build_dir>/bench/<name> when the binary is older than its
    sources or than any file in deps (e.g. a library it links). Returns the binary's path."""
    out_dir = os.path.join(ROOT, build_dir, "bench") if not os.path.isabs(build_dir) else os.path.join(build_dir, "bench")
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.join(out_dir, name)
    srcs = [os.path.join(BENCH, s) for s in sources]
    if os.path.exists(exe) and all(os.path.getmtime(exe) >= os.path.getmtime(s) for s in srcs + list(deps)):
        return exe
    if not shutil.which(compiler):
        sys.exit(f"bench: compiler '{compiler}' not found (Debian: build-essential, libopenmpi-dev)")
    cmd = [compiler] + flags + ["-Wall", "-Wextra", "-Werror", "-o", exe] + srcs + libs
    r = subprocess.run(["timeout", "300"] + cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: '{' '.join(cmd)}' failed:\n{r.stderr[-3000:]}")
    return exe


def pkg_config(*args):
    r = subprocess.run(["pkg-config"] + list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"bench: pkg-config {' '.join(args)} failed (Debian: libopenblas-dev, pkg-config)")
    return r.stdout.split()


def run(cmd, timeout_s, env=None, what=None, cwd=None):
    """Runs cmd under `timeout -k 5 timeout_s`; returns (stdout, stderr). Raises SideFailed naming
    `what` with the exit code (or the timeout) and the tail of stderr."""
    what = what or os.path.basename(cmd[0])
    full = ["timeout", "-k", "5", str(int(timeout_s))] + [str(c) for c in cmd]
    try:
        r = subprocess.run(full, capture_output=True, text=True, env=env, cwd=cwd,
                           timeout=timeout_s + 30)
    except subprocess.TimeoutExpired:
        raise SideFailed(f"{what}: did not finish within {timeout_s:.0f} s (killed)")
    if r.returncode == 124 or r.returncode == 137:
        raise SideFailed(f"{what}: did not finish within {timeout_s:.0f} s (killed); "
                         f"stderr tail: {r.stderr.strip()[-800:]}")
    if r.returncode != 0:
        raise SideFailed(f"{what}: exit code {r.returncode}; command: {' '.join(str(c) for c in cmd)}\n"
                         f"  stderr tail: {r.stderr.strip()[-1500:]}")
    return r.stdout, r.stderr


def parse_json(text, what):
    """The first JSON value in text (tolerates log lines before it). Raises SideFailed."""
    text = text.strip()
    for start in [m.start() for m in re.finditer(r"[\[{]", text)]:
        try:
            return json.JSONDecoder().raw_decode(text[start:])[0]
        except json.JSONDecodeError:
            continue
    raise SideFailed(f"{what}: no JSON on stdout; got: {text[:500]!r}")


def median(xs):
    return statistics.median(xs) if xs else None


def mean(xs):
    return statistics.fmean(xs) if xs else None


def spread(xs):
    """(median, min, max) of the values that are not None, or (None, None, None)."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def read_first_line(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        out = (r.stdout or r.stderr).strip().splitlines()
        return out[0] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"


def machine():
    """The facts a reader needs to judge the numbers: CPU, cores, memory, kernel, versions."""
    info = {"cpu": "?", "cores": os.cpu_count(), "kernel": platform.release()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            v = v.strip()
            if k == "Model name":
                info["cpu"] = v
            elif k == "Hypervisor vendor":
                info["hypervisor"] = v
            elif k == "L3 cache":
                info["l3"] = v
        flags = re.search(r"^Flags:\s*(.*)$", out, re.M)
        if flags:
            f = flags.group(1).split()
            info["simd"] = " ".join(x for x in ("avx2", "fma", "avx512f", "avx512_bf16") if x in f)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        with open("/proc/meminfo") as fh:
            kb = int(re.search(r"MemTotal:\s+(\d+)", fh.read()).group(1))
            info["memory_gib"] = round(kb / 1024 / 1024, 1)
    except (OSError, AttributeError):
        pass
    info["os"] = read_first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"])
    info["gcc"] = read_first_line(["gcc", "--version"])
    info["dtrain_commit"] = read_first_line(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    return info


def loadavg():
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "?"


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc)


def pkg_version(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True)
    return r.stdout.strip() or "not installed"


def fmt_num(x, digits=3):
    """Compact human formatting: 3 significant digits, thousands kept whole."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    if ax >= 0.01:
        return f"{x:.3f}"
    return f"{x:.2g}"


def fmt_size(b):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)(i?B?)?", s.strip(), re.I)
    if not m:
        raise ValueError(f"bad size '{s}' (examples: 4, 64K, 256M)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def run_timed(cmd, timeout_s, env=None, what=None, cwd=None):
    """Runs cmd under /usr/bin/time -v (and timeout). Returns (stdout, stderr, peak_rss_mb): the
    "Maximum resident set size" of the largest process in the tree (for a launcher: its largest
    worker, not the sum). time's report goes to a file so that stderr stays the program's own."""
    if not os.access("/usr/bin/time", os.X_OK):
        raise SideFailed("/usr/bin/time is missing (Debian package: time)")
    import tempfile
    fd, rep = tempfile.mkstemp(prefix="dtrain-bench-time-")
    os.close(fd)
    try:
        out, err = run(["/usr/bin/time", "-v", "-o", rep] + list(cmd), timeout_s, env=env, what=what, cwd=cwd)
        with open(rep) as fh:
            m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", fh.read())
    finally:
        os.unlink(rep)
    return out, err, (int(m.group(1)) / 1024.0 if m else None)


# Training FLOPs per sample of the benchmark models: forward 2 x MACs, backward 2 x MACs for the
# weight gradients and 2 x MACs for the input gradients (not needed for the first layer). Biases,
# activations, pooling and the optimizer are left out (well under 1%).
MODEL_LAYERS = {
    # (MACs per sample, is first layer)
    "mlp": [(784 * 1024, True), (1024 * 1024, False), (1024 * 10, False)],
    "cnn": [(28 * 28 * 32 * 5 * 5 * 1, True), (14 * 14 * 64 * 5 * 5 * 32, False), (3136 * 512, False),
            (512 * 10, False)],
}


def train_flops_per_sample(model):
    return sum(2 * m + 2 * m + (0 if first else 2 * m) for m, first in MODEL_LAYERS[model])


def thread_env(threads):
    """The environment PEERS.md prescribes for a fair thread count on both sides."""
    t = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, OMP_WAIT_POLICY="PASSIVE")


def steady_rate(summary):
    """(samples/s, key) for a training summary: its steady-state rate (dtrain train and the
    PyTorch scripts both report `steady_samples_per_s`: the median over 10-step intervals after the
    first), else its whole-run samples_per_s."""
    for k in ("steady_samples_per_s",):
        v = summary.get(k)
        if isinstance(v, (int, float)) and v > 0:
            return float(v), k
    v = summary.get("samples_per_s")
    return (float(v), "samples_per_s") if isinstance(v, (int, float)) else (None, None)


def dtrain_interval_spread(summary):
    """Adds steady_samples_per_s_p10/_p90 to a dtrain train summary from the per-interval rates
    of its metrics file (the "step" lines after the first, as its steady rate uses)."""
    path = summary.get("metrics_file")
    if not path or not os.path.exists(path):
        return summary
    rates = []
    with open(path) as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if d.get("type") == "step" and isinstance(d.get("samples_per_s"), (int, float)):
                rates.append(float(d["samples_per_s"]))
    rates = rates[1:] if len(rates) > 1 else rates
    if rates:
        summary["steady_samples_per_s_p10"] = percentile(rates, 0.1)
        summary["steady_samples_per_s_p90"] = percentile(rates, 0.9)
        summary["intervals"] = len(rates)
    return summary


def find_key(summary, *words):
    """The first numeric value whose key contains all the words (e.g. exposed + comm)."""
    for k, v in summary.items():
        if all(w in k for w in words) and isinstance(v, (int, float)):
            return k, float(v)
    return None, None


def update_doc(name, text, doc=os.path.join(ROOT, "docs", "BENCHMARKS.md")):
    """Replaces the part of docs/BENCHMARKS.md between <!-- NAME:begin --> and <!-- NAME:end -->
    with text (a run's results, command and date included). Returns True if the markers were
    found."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    try:
        with open(doc) as fh:
            cur = fh.read()
    except OSError:
        return False
    i, j = cur.find(begin), cur.find(end)
    if i < 0 or j < i:
        return False
    # headings of the results move one level down under the doc's section
    body = re.sub(r"^(#+) ", lambda m: "##" + m.group(1) + " ", text.strip(), flags=re.M)
    with open(doc, "w") as fh:
        fh.write(cur[:i + len(begin)] + "\n" + body + "\n" + cur[j:])
    return True


def wait_ranks(procs, timeout, who):
    """Waits for rank processes (rank 0 first, its stdout piped) within timeout seconds and
    returns rank 0's stdout as text; kills them all and exits naming `who` on a timeout or a
    non-zero exit code."""
    import subprocess
    import sys
    import time
    deadline = time.monotonic() + timeout
    try:
        out, _ = procs[0].communicate(timeout=timeout)
        for p in procs[1:]:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        sys.exit(f"{who}: ranks did not finish within {timeout:.0f} s; killed")
    codes = [p.returncode for p in procs]
    if any(codes):
        for p in procs:
            if p.poll() is None:
                p.kill()
        sys.exit(f"{who}: rank exit codes {codes}")
    return out.decode()


# Repetitions with seeds, as bench/train-vs-pytorch and bench/ddp-vs-pytorch run them: one
# epoch's test accuracy moves by about half a point from seed to seed, so an accuracy comparison
# needs several seeds; repetition k (from 1) uses seed k on both sides.
REPS_HELP = ("repeat every configuration: N, or per model as mlp=3,cnn=1; repetition k uses seed k on both sides "
             "(speeds: medians; accuracy: mean over the seeds, with min-max)")


def parse_reps(text, models):
    """--reps N (every model) or a per-model list like mlp=3,cnn=1 (models not named: 1).
    Returns {model: repetitions}. Raises ValueError with a message for a usage error: not a
    count, a count below 1, or a model that is not in models."""
    try:
        if "=" in text:
            reps = {m: 1 for m in models}
            reps.update({k: int(v) for k, v in (p.split("=", 1) for p in text.split(",") if p)})
        else:
            reps = {m: int(text) for m in models}
    except ValueError:
        raise ValueError("--reps is a count or a list like mlp=3,cnn=1")
    if set(reps) - set(models):
        raise ValueError(f"--reps names {sorted(set(reps) - set(models))}, not in --models {models}")
    if reps and min(reps.values()) < 1:
        raise ValueError("--reps counts must be >= 1")
    return reps


def reps_text(reps, models):
    return ", ".join(f"{m} {reps[m]}" for m in models)


def rep_schedule(reps, models):
    """(repetition from 0, seed, model) in run order: repetition k of every model that has one
    before repetition k+1 of any, so a slow drift of the machine's load spreads over all models."""
    for rep in range(max(reps.values(), default=0)):
        for model in models:
            if rep < reps[model]:
                yield rep, rep + 1, model


def accuracy_over_seeds(runs):
    """(mean, text) of the runs' test_accuracy: the mean over the seeds, and with several runs
    their min-max in parentheses; (None, "-") without any."""
    accs = [s["test_accuracy"] for s in runs if isinstance(s.get("test_accuracy"), (int, float))]
    if not accs:
        return None, "-"
    acc = sum(accs) / len(accs)
    txt = f"{acc * 100:.2f}%"
    if len(accs) > 1:
        txt += f" ({min(accs) * 100:.2f}-{max(accs) * 100:.2f})"
    return acc, txt


ACCURACY_NOTE = ("Accuracy after one epoch moves by about half a point from seed to seed, so with several "
                 "repetitions each uses another seed (the same on both sides) and 'test acc' is the mean "
                 "(min-max over the seeds).")
