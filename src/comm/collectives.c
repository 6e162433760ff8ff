/* collectives.c - the public blocking collectives of dtrain/comm.h: argument checks, the
 * fingerprint (sequence number, call, count, dtype, op, root), the choice of algorithm, and the
 * error context. The algorithms themselves live in comm/coll/, the ordering with nonblocking
 * calls in progress.c.
 *
 * Every failure leaves a detail "rank R: allreduce #17 with 4096 x f32 sum: <cause>" and raises
 * the job-wide abort (dt__comm_fail) so that ranks still waiting in the same call stop too; the
 * communicator is then broken. Count 0 still exchanges one round of zero-byte messages with the
 * fingerprint, so a rank passing 0 while another passes 4 is reported rather than left to time
 * out. It deliberately does not cache DTRAIN_ALGO: tests change it between calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/coll/coll.h"

static const char *algo_names[DT_ALGO_COUNT] = {
    [DT_ALGO_AUTO] = "auto",   [DT_ALGO_RING] = "ring",     [DT_ALGO_RD] = "rd",
    [DT_ALGO_SHM] = "shm",     [DT_ALGO_TREE] = "tree",     [DT_ALGO_CHAIN] = "chain",
    [DT_ALGO_DISSEM] = "dissem", [DT_ALGO_PAIRWISE] = "pairwise", [DT_ALGO_LINEAR] = "linear",
    [DT_ALGO_FLAT] = "flat",   [DT_ALGO_RHD] = "rhd",       [DT_ALGO_BRUCK] = "bruck",
};

const char *dt__algo_name(dt__algo a) { return (unsigned)a < DT_ALGO_COUNT ? algo_names[a] : "?"; }

/* Which algorithms each collective has (bit per dt__algo). */
static unsigned algos_of(dt__coll k) {
#define B(a) (1u << (a))
  switch (k) {
  case DT_COLL_ALLREDUCE:
    return B(DT_ALGO_RING) | B(DT_ALGO_RD) | B(DT_ALGO_SHM) | B(DT_ALGO_FLAT) | B(DT_ALGO_RHD);
  case DT_COLL_BROADCAST: return B(DT_ALGO_TREE) | B(DT_ALGO_CHAIN) | B(DT_ALGO_SHM) | B(DT_ALGO_FLAT);
  case DT_COLL_ALLGATHER: return B(DT_ALGO_RING) | B(DT_ALGO_SHM) | B(DT_ALGO_FLAT) | B(DT_ALGO_BRUCK);
  case DT_COLL_REDUCE_SCATTER: return B(DT_ALGO_RING) | B(DT_ALGO_SHM) | B(DT_ALGO_FLAT) | B(DT_ALGO_RHD);
  case DT_COLL_REDUCE: return B(DT_ALGO_TREE);
  case DT_COLL_GATHER: case DT_COLL_SCATTER: return B(DT_ALGO_LINEAR);
  case DT_COLL_ALLTOALL: return B(DT_ALGO_PAIRWISE);
  case DT_COLL_BARRIER: return B(DT_ALGO_DISSEM) | B(DT_ALGO_SHM);
  default: return 0;
  }
#undef B
}

/* The transport's fast path for a collective, if it has one. */
static int has_fast(const dt_transport_ops *ops, dt__coll k) {
  switch (k) {
  case DT_COLL_ALLREDUCE: return ops->allreduce != NULL;
  case DT_COLL_BROADCAST: return ops->broadcast != NULL;
  case DT_COLL_ALLGATHER: return ops->allgather != NULL;
  case DT_COLL_REDUCE_SCATTER: return ops->reduce_scatter != NULL;
  case DT_COLL_BARRIER: return ops->barrier != NULL;
  default: return 0;
  }
}

/* The one place algorithms are chosen: a pure function of (collective, ranks, bytes per rank,
 * transport). Thresholds come from
 *   dtrain bench allreduce -n {2,4} --transport {shm,tcp} --algo {rd,ring,shm} --sizes 1K:4M --iters 30
 *   dtrain bench broadcast -n 4 --transport {shm,tcp} --algo {tree,chain} --sizes 16K:4M --iters 20
 * run twice, alternating, on the 2-core EPYC VM while other jobs loaded it (load average 17-70,
 * so single points are noisy; the cut points below held in both runs):
 *   allreduce, transport with a shared-memory fast path (shm): recursive doubling ~1-3 us up to
 *     32 KiB when the cores are free; the fast path wins from 64 KiB on (n=2: 0.26 ms vs rd
 *     0.40 ms at 64 KiB, 0.35 vs 2.5 ms at 128 KiB).
 *     n=2 since the single copies (process_vm_readv/writev): rd up to 32 KiB, and above, up to
 *     128 KiB, whichever of rd and the fast path the job's own calls time faster (tune_*
 *     below): on the Zen 5 guest rd led there, on the EPYC Zen 3 guest the fast path, and
 *     compare-peers at 64 KiB with rd read 0.77x Open MPI on the Zen 3
 *     (compare-peers-2026-12-03g-zen3.md), 1.86x with the fast path (-03l-zen3.md).
 *   allreduce, without (tcp): rd beats ring up to 128 KiB at n=2 (0.25-0.45 ms vs 0.49-2.3 ms)
 *     and n=4 (0.96-1.8 ms vs 0.98 ms); at 256 KiB they tie; above, ring. For n > 4, rd moves
 *     log2(n) whole buffers against the ring's 2(n-1)/n, so its cut stays at 32 KiB (not measured).
 *     n=2 since the ring's wavefront (ring.c): rd up to 512 KiB. `DTRAIN_ALGO={rd,ring} dtrain
 *     bench allreduce -n 2 --transport tcp --sizes 32K:2M --iters 100 --warmup 10`, 4 alternated
 *     repetitions in each of three runs, 2026-11-22 18:25-18:45 UTC, load 1.6-4.5 (another
 *     helper's benchmarks), medians: f32 rd/ring 35/48, 58/91, 105/150 us at 128/256/512 KiB in
 *     the first run, 32/38, 53/60, 99/115 in the second, 35/39, 64/63, 123/125 in the third;
 *     f16 (--dtype f16) 36/47, 64/84, 117/163; at 1 MiB the ring leads (252-278 against rd's
 *     449-556), at 2 MiB by 2-3x.
 *   allreduce without a fast path, n a power of two > 2: rhd (rhd.c: the ring's bytes in 2 log2(n)
 *     exchanges instead of 2(n-1) steps) above 32 KiB, replacing rd's range up to 128 KiB and the
 *     ring above it. Measured 2026-11-22 15:49-16:05 UTC, 4 ranks on the 2 cores, tcp, medians of
 *     4-6 alternated repetitions of `DTRAIN_ALGO={ring,rhd,rd} dtrain bench allreduce -n 4
 *     --transport tcp --sizes 16K:16M --iters 10` (with Open MPI over tcp in the same rotation,
 *     other jobs loading the machine, load average 4-7): 16-32 KiB rd 144-159 us, rhd 154-162,
 *     ring 251; 64 KiB rhd 172 against rd 190-215 and ring 263-281; 128 KiB rhd 239-247 against
 *     rd 289-303 and ring 299-324; 512 KiB rhd 687-872 against ring 727-893; 4 MiB rhd 8.2-11.3
 *     ms against ring 9.5-13.0; 16 MiB rhd 38-53 ms against ring 43-56. With 8 ranks (3 runs,
 *     16K:4M) rd led at 16-32 KiB (307-481 us against rhd 453-685), tied at 64 KiB, and rhd led the ring
 *     from 512 KiB (1.8 against 2.4-3.0 ms; 2 MiB 7.4-11.6 against 11.5-25 ms). All paired 4-rank
 *     repetitions pooled (28 at each of 1-16 MiB): rhd faster in 18/16/19/12/18 of 28 at
 *     1/2/4/8/16 MiB, median ring/rhd 1.32/1.11/1.11/0.89/1.06: level above 1 MiB. With 2 ranks the
 *     two algorithms are the same exchanges (one halving, one doubling): the ring stays. Other n
 *     keep the ring (rhd's fold moves a whole buffer more for the folded ranks). See
 *     docs/BENCHMARKS-LOG.md, "4 ranks on 2 cores".
 *   broadcast: binomial tree below 256 KiB, pipelined chain from there (with 2 ranks both are
 *     one transfer: tree). The first runs (256 KiB chain pieces) put the cut at 1 MiB; with the
 *     64 KiB pieces of 2026-11-28 (tree.c) the chain leads from 256-512 KiB: `DTRAIN_CHAIN_PIECE=
 *     65536 dtrain bench broadcast -n {4,3} --transport tcp --sizes 128K:2M --iters 30 --warmup 5
 *     --algo {tree,chain}`, three alternated runs on the EPYC guest: n=4 tree 179-246 / 245-355
 *     / 403-629 / 962-1407 / 2732-3954 us at 128 KiB / 256 KiB / 512 KiB / 1 MiB / 2 MiB against
 *     the chain's 178-236 / 270-354 / 445-563 / 608-1029 / 1522-2341; n=3 tree 201-227 / 337-379
 *     / 605-718 / 844-1406 / 1988-2319 against 164-198 / 214-294 / 332-425 / 678-788 /
 *     1178-1358.
 *   allgather, reduce_scatter, broadcast on shm (`dtrain bench <coll> -n {2,4} --transport shm
 *     --algo {ring|tree|chain,shm} --sizes 1K:4M --iters 20`, twice, load average ~20): the fast
 *     path won allgather at <= 128 KiB (n=4: 53-70 us vs 103-121 us) and at 4 MiB with n=2
 *     (7.8-9.5 ms vs 15.4-15.8 ms), elsewhere the runs disagreed: allgather takes it at every
 *     size. reduce_scatter: the fast path won up to 128 KiB in total, i.e. 32 KiB blocks at n=4
 *     (44-63 us vs 107-127 us),
 *     above the runs disagreed: ring. Since the fast path no longer stages a rank's own block
 *     (2026-11-22, for ZeRO-1's gradient reduce-scatter), n=2 takes it at every size: `dtrain
 *     bench reduce_scatter -n 2 --transport shm --algo {ring,shm} --sizes 64K:8M --iters 30`,
 *     two alternated runs at load 10-14: shm 2.0-6.3 us at 64-256 KiB against ring's 2.2-14.2,
 *     30-31 / 60-63 / 128 / 432-514 us at 1 / 2 / 4 / 8 MiB against 38-48 / 75-81 / 160-207 /
 *     528-697. n=4 (oversubscribed) stayed noisy both ways: unchanged.
 *     broadcast: no consistent winner: tree/chain as above (since the flat slots and their
 *     measurements below: the staging buffers).
 *   barrier: the transport's own when present (one shared counter beats log2(n) messages).
 *   allreduce, flat (one round through per-rank slots, shm): measured 2026-11-22 with ranks bound
 *     one per CPU, `DTRAIN_ALGO={flat,rd,shm} dtrain bench allreduce -n {2,4} --transport shm
 *     --sizes 4:256K --iters 100..200`, three alternating runs, load average ~10 from other jobs:
 *     n=2: flat 0.21-0.22 us at 4-64 B, 0.31 at 1 KiB, 0.50-0.52 at 4 KiB against rd's 0.30,
 *     0.34-0.38, 0.58 and the shm path's 0.37, 0.44, 0.64-0.71; at 8 KiB rd leads (0.78 against
 *     0.84), at 16-32 KiB rd 1.25-1.35 / 2.3-2.4 against flat 1.55 / 2.95: flat up to 4 KiB.
 *     n=4 (oversubscribed on 2 cores): flat 9-15 us at 4 B - 16 KiB, 14-19 at 32 KiB, against
 *     rd 13-34 / 13-41 and shm 10-34 / 14-35; from 64 KiB shm leads (20-42 against flat 24-40,
 *     and 51-68 against 86-159 at 256 KiB): flat up to 32 KiB for n > 2.
 *   allreduce of f16/bf16 with sum/prod/avg ("wide": accumulated in f32, rounded once), n=2:
 *     rd used to carry f32 (twice the bytes, a conversion pass each way) and the halves skipped it
 *     on shm (1.7-2.1 / 3.0-3.7 / 5.9-7.2 us at 8 / 16 / 32 KiB against the shm path's
 *     0.96-2.59) and left it above 16 KiB on tcp. rd now moves the half types at n=2 (one
 *     exchange, one f32 operation rounded once: the same bits), and the halves take f32's range
 *     again: `bench/dtypes --sizes 4K:64K|4K:256K --iters 300 --warmup 30 --reps 5` over wrappers
 *     forcing DTRAIN_ALGO, three alternated runs, 2026-11-22 16:50-16:57 (load 12-22;
 *     bench/results/dtypes-2026-11-22d.txt, last section), busbw medians: shm 8 / 16 / 32 KiB
 *     f16 rd 3.8 / 5.8 / 7.6 GB/s against the shm path's 2.7 / 3.9 / 5.0 at load 18-22 (bf16
 *     alike), 8.8 / 11.0 / 13.2 against 7.9 / 11.4 / 12.6 at load 12; tcp rd against the ring
 *     0.98 / 1.9 / 3.4 / 3.4 / 4.3 against 0.60 / 1.0 / 2.0 / 3.4 / 3.5 GB/s at 8 / 16 / 32 /
 *     64 / 128 KiB (load 12; at load 18-22 alike). For n > 2 rd's later rounds still carry f32
 *     partials: unchanged there.
 *   broadcast, allgather, reduce_scatter, flat (the allreduce's one-round slots, shm): measured
 *     2026-11-26 on the Xeon guest, `dtrain bench <coll> -n {2,4} --transport shm --algo
 *     {flat,shm[,tree]} --sizes 4:4M --iters 100 (n=4: 50) --warmup 10`, three alternated runs,
 *     medians (bench/results/flat-2026-11-26-xeon.txt; sizes as nccl-tests', the gathered or
 *     whole input for allgather and reduce_scatter):
 *     broadcast n=2: flat 0.56-0.75 us to 512 B against tree's 0.72-0.86 and shm's 1.2-1.3,
 *     8.4 / 24 / 104 us at 64 KiB / 256 KiB / 1 MiB against tree's 10.5 / 41 / 120; level at 2-4
 *     MiB. n=4: flat 8.2-9.7 us to 8 KiB against tree's 9.7-15 and shm's 12-16, 341 us at 1 MiB
 *     against shm 346 and tree 532 (level with shm from 128 KiB). n=8 (two runs, --iters 30): flat
 *     23-34 us to 8 KiB against tree's 33-63 and shm's 41-55, 65-69 / 950-1055 us at 64 KiB / 1
 *     MiB against shm's 75-85 / 786-825 and tree's 113-128 / 2012-2199: flat up to 1 MiB for up
 *     to 4 ranks, up to 64 KiB above, then shm to 1 MiB. Measured again 2026-12-05 on the Zen 5
 *     guest with the staging buffers as they are since (copies through dt__copy, pages read at
 *     setup), same commands, three alternated runs (bench/results/broadcast-2026-12-05-zen5.txt):
 *     the staging buffers lead the flat slots from 8 KiB at n=2 without single copies (1.4 against
 *     1.6 us, 15 against 25 at 256 KiB, 48-51 against 91-94 at 1 MiB), from 64 KiB at n=3 and
 *     n=4 (n=4: 24-35 against 59-77 us, 45-71 against 191-222 at 256 KiB, 108-121 against 410-418
 *     at 1 MiB; level to 32 KiB) and at n=8 (69-103 against 133-147 at 64 KiB, 273-300 against
 *     1220-1232 at 1 MiB); above 1 MiB they lead the chain 1.4-2.5x at n=4 and about 2x at n=8
 *     (2-16 MiB) and run level with the tree at n=2. Flat up to 4 KiB at n=2 and 32 KiB above,
 *     the staging buffers beyond at every size.
 *     allgather: flat 0.70-0.85 us to 512 B against 1.0-1.2 (n=2), 28 / 30 us at 256 KiB, shm
 *     ahead from 1 MiB (134 / 169); n=4 flat level or ahead at every size: flat up to 128 KiB
 *     blocks. reduce_scatter n=2: flat 0.57-0.68 us to 512 B against 0.91-1.03, level from 256
 *     KiB; n=4: flat ahead to 8 KiB (11-13 against 12-14 us), behind from 32 KiB (18 / 17, 31 /
 *     26 at 64 KiB): blocks up to 64 KiB (n=2) or 2 KiB (n>2).
 *   broadcast and allgather, single copies (where the transport has them, `single`: shm from 16
 *     KiB per rank, see SHM_DEFAULT_CMA_MOVE in shm.c) ahead of the flat slots: one copy instead
 *     of two. Allgather used to keep the flat slots to 128 KiB blocks even there: 12.9-13.8 us at
 *     64 KiB blocks against 5.0-5.2 single (2026-11-29, Xeon guest,
 *     bench/results/cma-small-2026-11-29-xeon.txt, section 4).
 *   allgather, bruck (transports without a fast path: tcp): measured 2026-11-28 on the EPYC
 *     guest, `dtrain bench allgather -n {4,3} --transport tcp --algo {ring,bruck} --sizes 4:1M
 *     --iters 60 --warmup 6`, three alternated runs (sizes as gathered): n=4 bruck 59-86 us from
 *     32 B to 32 KiB against ring's 68-209, 79-95 against 127-251 at 64 KiB (16 KiB blocks), then
 *     level or mixed (128 KiB - 1 MiB: 172-257 / 300-410 / 502-612 / 894-1098 against 165-292 /
 *     310-433 / 548-818 / 949-1023); n=3 bruck 37-76 us from 24 B to 48 KiB against 63-176,
 *     ahead or level above. Blocks up to 16 KiB for n > 2 (n=2 is one exchange either way); rows
 *     in bench/results/trees-bruck-chain-2026-11-28-epyc.txt.
 *   reduce_scatter, rhd (recursive halving; no fast path, n a power of two > 2): measured
 *     2026-11-28 on the EPYC guest, `dtrain bench reduce_scatter -n {4,8} --transport tcp --algo
 *     {ring,rhd} --sizes 4:4M --iters 60 --warmup 6` (n=8: to 1M, 40 iterations), alternated,
 *     3 runs at n=4 and 2 at n=8, medians (sizes as reduced, n blocks): n=4 rhd 60-74 us from 16
 *     B to 8 KiB against the ring's 80-98, 90-119 against 102-128 at 16-64 KiB, level at 128-256
 *     KiB, behind from 512 KiB (625 / 1221 against 474 / 946 at 512 KiB / 1 MiB: the ring
 *     pipelines its steps, the halving's rounds are whole); n=8 rhd 214-401 us to 128 KiB
 *     against 530-861, 629 against 964 at 256 KiB, behind from 512 KiB (0.78x). Blocks up to 32
 *     KiB; rows in bench/results/rs-rhd-2026-11-28-epyc.txt. */
static dt__algo choose(dt__coll k, int n, size_t bytes, int wide, const dt_transport_ops *ops, size_t single) {
  if (ops->fast_paths_always && has_fast(ops, k))
    return DT_ALGO_SHM;
  switch (k) {
  case DT_COLL_ALLREDUCE:
    if (n <= 1)
      return DT_ALGO_RD;
    if (ops->flat && bytes <= (n == 2 ? (4u << 10) : (32u << 10)))
      return DT_ALGO_FLAT;
    /* wide (f16/bf16 sum, prod, avg): at n = 2 rd moves the half types (one exchange, one
     * rounding) and takes f32's range; above, its later rounds carry f32 partials (twice the
     * bytes, a conversion pass each way), while flat, shm and ring move the half types. */
    if (has_fast(ops, k)) {
      return bytes <= (32u << 10) && (n == 2 || !wide) ? DT_ALGO_RD : DT_ALGO_SHM; /* n = 2: timed (tune_*) */
    }
    if (wide && n > 2)
      return bytes <= (16u << 10) ? DT_ALGO_RD : DT_ALGO_RING;
    if (n > 2 && (n & (n - 1)) == 0) /* 4, 8, ...: Rabenseifner above rd's range */
      return bytes <= (32u << 10) ? DT_ALGO_RD : DT_ALGO_RHD;
    return bytes <= (n == 2 ? (512u << 10) : n <= 4 ? (128u << 10) : (32u << 10)) ? DT_ALGO_RD : DT_ALGO_RING;
  case DT_COLL_BROADCAST:
    if (single && bytes >= single && has_fast(ops, k))
      return DT_ALGO_SHM;
    if (ops->flat && bytes <= (n == 2 ? (4u << 10) : (32u << 10)))
      return DT_ALGO_FLAT;
    if (has_fast(ops, k))
      return DT_ALGO_SHM;
    return bytes < (256u << 10) || n <= 2 ? DT_ALGO_TREE : DT_ALGO_CHAIN;
  case DT_COLL_ALLGATHER: /* bytes: one block */
    if (single && bytes >= single && has_fast(ops, k))
      return DT_ALGO_SHM;
    if (ops->flat && bytes <= (128u << 10))
      return DT_ALGO_FLAT;
    if (has_fast(ops, k))
      return DT_ALGO_SHM;
    return n > 2 && bytes <= (16u << 10) ? DT_ALGO_BRUCK : DT_ALGO_RING;
  case DT_COLL_REDUCE_SCATTER: /* bytes: one block */
    if (ops->flat && bytes <= (n == 2 ? (64u << 10) : (2u << 10)))
      return DT_ALGO_FLAT;
    if (has_fast(ops, k))
      return n == 2 || bytes <= (32u << 10) ? DT_ALGO_SHM : DT_ALGO_RING;
    return n > 2 && (n & (n - 1)) == 0 && !wide && bytes <= (32u << 10) ? DT_ALGO_RHD : DT_ALGO_RING;
  case DT_COLL_REDUCE:
    return DT_ALGO_TREE;
  case DT_COLL_GATHER:
  case DT_COLL_SCATTER:
    return DT_ALGO_LINEAR;
  case DT_COLL_ALLTOALL:
    return DT_ALGO_PAIRWISE;
  case DT_COLL_BARRIER:
    return has_fast(ops, k) ? DT_ALGO_SHM : DT_ALGO_DISSEM;
  default:
    return DT_ALGO_AUTO;
  }
}

/* DTRAIN_ALGO: comma-separated items; "name" applies to allreduce, "coll=name" to that
 * collective ("ring", "broadcast=chain,barrier=dissem"). Any unknown collective or name is
 * DT_ERR_INVALID. *out = DT_ALGO_AUTO when nothing applies to k. */
static dt_status algo_override(dt__coll k, dt__algo *out) {
  *out = DT_ALGO_AUTO;
  const char *env = dt__env_str("DTRAIN_ALGO");
  if (!env)
    return DT_OK;
  char buf[256];
  if (strlen(env) >= sizeof buf)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_ALGO is too long");
  strcpy(buf, env);
  char *save = NULL;
  for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
    dt__coll ik = DT_COLL_ALLREDUCE;
    char *name = item, *eq = strchr(item, '=');
    if (eq) {
      *eq = '\0';
      name = eq + 1;
      ik = DT_COLL_NONE;
      for (int j = DT_COLL_ALLREDUCE; j <= DT_COLL_BARRIER; j++)
        if (!strcmp(item, dt__coll_name(j)))
          ik = (dt__coll)j;
      if (ik == DT_COLL_NONE)
        return dt_set_error(DT_ERR_INVALID, "DTRAIN_ALGO=%s: unknown collective '%s'", env, item);
    }
    dt__algo a = DT_ALGO_AUTO;
    for (int j = 1; j < DT_ALGO_COUNT; j++)
      if (!strcmp(name, algo_names[j]) && (algos_of(ik) & (1u << j)))
        a = (dt__algo)j;
    if (a == DT_ALGO_AUTO && strcmp(name, "auto")) {
      char list[128] = "";
      for (int j = 1; j < DT_ALGO_COUNT; j++)
        if (algos_of(ik) & (1u << j))
          snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? ", " : "", algo_names[j]);
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_ALGO=%s: unknown algorithm '%s' for %s (auto, %s)", env, name,
                          dt__coll_name(ik), list);
    }
    if (ik == k)
      *out = a;
  }
  return DT_OK;
}

dt_status dt__coll_algo_validate(void) {
  dt__algo a;
  return algo_override(DT_COLL_ALLREDUCE, &a); /* parses (and so checks) every item */
}

void dt__coll_algo_load(dt_comm *c) {
  c->algo_bad[0] = '\0';
  for (int k = 0; k < DT_COLL_COUNT; k++) {
    dt__algo a = DT_ALGO_AUTO;
    if (k >= DT_COLL_ALLREDUCE && k <= DT_COLL_BARRIER && algo_override((dt__coll)k, &a) != DT_OK) {
      snprintf(c->algo_bad, sizeof c->algo_bad, "%s", dt_last_error());
      a = DT_ALGO_AUTO;
    }
    c->algo[k] = (uint8_t)a;
  }
}

static size_t single_copy(dt_comm *c) { return c->ops->single_copy ? c->ops->single_copy(c->tp) : 0; }

/* ---- The timed choice: rd or the transport's fast path for the 2-rank allreduce ----
 *
 * Two ranks with a fast path (shm) at 32 KiB < bytes <= 128 KiB: which of rd (one exchange of the
 * whole buffer, each rank reducing all of it) and the fast path is faster depends on the host, and
 * on one host from job to job. On the Zen 5 guest rd led at 64-128 KiB (f32 6.4 against 10.9 us at
 * 64 KiB, bench/results/rd-shm-2026-12-03-zen5.txt); on the EPYC Zen 3 guest the fast path did that
 * afternoon (38-40 against 16-17 us, rd-shm-2026-12-03-zen3.txt), and that evening rd read
 * 10.4-27.6 us against the fast path's 8.4-22.8 from job to job (tune-2026-12-03-zen3.txt, 5
 * alternated rounds). So the call times both, per class of size (powers of two) and element width
 * (tune_class): a class's first TUNE_FIRST calls take choose()'s answer untimed (new buffers fault
 * their pages in, the fast path's first single copies run 2-3x its later ones, and it times its own
 * two paths at its 8th call, shm.c), then a trial runs TUNE_TRIALS calls of the fast path and as
 * many of rd, each rank timing each algorithm's calls but the first of each run (which pays for the
 * switch). After the trial's last call one 16-byte rd exchange (its fingerprint flagged
 * DT__FP_TUNE, at the same place in the call sequence as the call it follows: dt__fp_same_place)
 * gives both ranks the slower rank's median time of each algorithm (a collective lasts as long as
 * its slower rank), and both take the algorithm whose median is lower, so they always agree.
 * Medians of five: the fast path's own timing of its slower path (shm.c) can fall into a trial, and
 * in one that call and the next took 64.7 and 93.6 us against the others' 24.8-31.7
 * (tune-2026-12-03-zen3.txt); with three timed calls such a pair set the median, and a job that had
 * taken rd kept it against a fast path read at 1.9-5.5x its time. A trial runs again at the class's
 * 64th call and every TUNE_EVERY calls: six calls in 256 of an algorithm twice as slow cost about
 * 2%. Either algorithm leaves both ranks with the same bits, and a sum is the same bits by either
 * (the two operands are added once, in either order); only a min or max of +0 and -0, or of two
 * NaNs, may come out with the other sign or payload after a change. DTRAIN_ALGO and calls in the
 * shared window are not timed. */
#define TUNE_LO (32u << 10) /* exclusive */
#define TUNE_FIRST 16
#define TUNE_TRIALS (DT__TUNE_TIMED + 1)
#define TUNE_EVERY 256
#define TUNE_SIZES (DT__TUNE_CLASSES / 2) /* size classes; each has a class for 16-bit elements */

/* The class of a call the timed choice applies to, or NULL: its size class (0, 1), plus 2 for
 * 16-bit elements. The half types are timed on their own: rd reduces the whole buffer on each rank
 * where the fast path reduces half of it, and the half types' reduction widens and rounds every
 * element (f16 sums 41 GB/s of output from L1 on the Zen 5 against f32's 50,
 * bench/results/half-types-2026-12-04-zen5.txt), so where the two algorithms cross over can
 * differ between a job's f32 and half-type calls of one size. */
static dt__tune *tune_class(dt_comm *c, const dt__coll_call *k, size_t bytes) {
  if (k->kind != DT_COLL_ALLREDUCE || c->size != 2 || !c->ops->allreduce || c->ops->fast_paths_always ||
      c->algo[DT_COLL_ALLREDUCE] != DT_ALGO_AUTO || (k->fp.flags & DT__FP_WINDOW) || bytes <= TUNE_LO)
    return NULL;
  unsigned cls = 0;
  for (size_t b = (bytes - 1) >> 16; b; b >>= 1) /* (32 KiB, 64 KiB]: class 0 */
    cls++;
  return cls < TUNE_SIZES ? &c->tune[cls + (dt_dtype_size(k->dtype) == 2 ? TUNE_SIZES : 0)] : NULL;
}

/* The algorithm of the class's next call (`a`: choose()'s, until the first trial ends). */
static dt__algo tune_next(dt__tune *u, dt__algo a) {
  uint64_t i = ++u->calls;
  if (i == TUNE_FIRST + 1 || i == 64 || i % TUNE_EVERY == 0)
    u->trial_end = i + 2 * TUNE_TRIALS - 1;
  if (u->trial_end)
    return u->trial_end - i >= TUNE_TRIALS ? DT_ALGO_SHM : DT_ALGO_RD;
  return u->algo ? (dt__algo)u->algo : a;
}

static int64_t tune_median(int64_t *v) {
  for (int i = 1; i < DT__TUNE_TIMED; i++)
    for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
      int64_t x = v[j];
      v[j] = v[j - 1];
      v[j - 1] = x;
    }
  return v[DT__TUNE_TIMED / 2];
}

/* After a call of algorithm a took ns on this rank: a trial's last call agrees on its verdict. */
static dt_status tune_record(dt_comm *c, dt__tune *u, dt__algo a, int64_t ns, const dt__fp *fp, int64_t deadline) {
  if (!u->trial_end)
    return DT_OK;
  const uint64_t left = u->trial_end - u->calls; /* calls of the trial after this one */
  const int at = TUNE_TRIALS - 1 - (int)(left % TUNE_TRIALS); /* this call's place in its run */
  if (at > 0) /* the run's first call pays for the switch */
    u->ns[a == DT_ALGO_RD][at - 1] = ns;
  if (left)
    return DT_OK;
  u->trial_end = 0;
  int64_t med[2] = {tune_median(u->ns[0]), tune_median(u->ns[1])};
  dt__fp tf = *fp;
  tf.count = 2;
  tf.dtype = DT_I64;
  tf.op = DT_MAX;
  tf.flags |= DT__FP_TUNE;
  DT_CHECK(dt__allreduce_rd(c, med, med, 2, DT_I64, DT_MAX, &tf, deadline));
  u->algo = med[1] < med[0] ? DT_ALGO_RD : DT_ALGO_SHM;
  const int cls = (int)(u - c->tune);
  DT_LOG_DEBUG("allreduce: calls of %s elements of over %zu and up to %zu KiB take %s from their call %llu (median us "
               "of the slower rank: fast path %.1f, rd %.1f)", cls >= TUNE_SIZES ? "16-bit" : "wider",
               (size_t)32 << (cls % TUNE_SIZES), (size_t)64 << (cls % TUNE_SIZES),
               u->algo == DT_ALGO_RD ? "rd" : "the fast path", (unsigned long long)u->calls + 1, (double)med[0] / 1e3,
               (double)med[1] / 1e3);
  return DT_OK;
}

static dt__algo pick(dt_comm *c, dt__coll k, size_t bytes, int wide, dt_status *st) {
  *st = DT_OK;
  if (c->algo_bad[0]) {
    *st = dt_set_error(DT_ERR_INVALID, "%s", c->algo_bad);
    return DT_ALGO_AUTO;
  }
  dt__algo a = (dt__algo)c->algo[k];
  if ((a == DT_ALGO_SHM && !has_fast(c->ops, k)) || (a == DT_ALGO_FLAT && !c->ops->flat)) {
    *st = dt_set_error(DT_ERR_INVALID, "DTRAIN_ALGO asks for the %s %s but transport %s has no such fast path",
                       algo_names[a], dt__coll_name(k), c->ops->name);
    return DT_ALGO_AUTO;
  }
  return a != DT_ALGO_AUTO ? a : choose(k, c->size, bytes, wide, c->ops, single_copy(c));
}

/* Single rank: the result is the input. */
static void exec_local(dt_comm *c, const dt__coll_call *k) {
  size_t bytes = k->count * dt_dtype_size(k->dtype);
  const void *s = k->sbuf;
  char *r = k->rbuf;
  if (!s || !bytes)
    return;
  switch (k->kind) {
  case DT_COLL_ALLREDUCE:
  case DT_COLL_REDUCE:
  case DT_COLL_REDUCE_SCATTER:
  case DT_COLL_ALLGATHER:
  case DT_COLL_GATHER:
  case DT_COLL_SCATTER:
  case DT_COLL_ALLTOALL:
    if (r && s != r)
      memmove(r, s, bytes);
    break;
  default:
    break;
  }
}

static dt_status allreduce_with(dt_comm *c, dt__algo a, const dt__coll_call *k, const void *sb, void *rb,
                                int64_t deadline) {
  if (a == DT_ALGO_SHM)
    return c->ops->allreduce(c->tp, sb, rb, k->count, k->dtype, k->op, &k->fp, deadline);
  if (!sb)
    sb = rb;
  if (a == DT_ALGO_RD)
    return dt__allreduce_rd(c, sb, rb, k->count, k->dtype, k->op, &k->fp, deadline);
  if (a == DT_ALGO_RHD)
    return dt__allreduce_rhd(c, sb, rb, k->count, k->dtype, k->op, &k->fp, deadline);
  return dt__allreduce_ring(c, sb, rb, k->count, k->dtype, k->op, &k->fp, deadline);
}

static dt_status exec_call(dt_comm *c, const dt__coll_call *k) {
  int n = c->size, r = c->rank;
  const dt__fp *fp = &k->fp;
  size_t es = dt_dtype_size(k->dtype), bytes = k->count * es;
  dt_status st = DT_OK;
  /* first: a bad DTRAIN_ALGO fails on one rank too */
  dt__algo a = pick(c, k->kind, bytes, dt__coll_wide(k->dtype, k->op), &st);
  if (st)
    return st;
  /* The flat allreduce reads the clock only once it has to wait (deadline 0: "from then"):
   * clock_gettime is ~50 ns on the KVM guest, a fifth of a small allreduce. */
  int64_t deadline = a == DT_ALGO_FLAT && k->count ? 0 : dt__comm_deadline(c);
  if (n == 1) {
    exec_local(c, k);
    return DT_OK;
  }
  if (k->count == 0 && k->kind != DT_COLL_BARRIER)
    return dt__barrier_dissem(c, fp, deadline);
  char *rb = k->rbuf;
  const void *sb = k->sbuf;
  /* A sendbuf that aliases recvbuf is still read as a send buffer (comm.h). From here on, in
   * place is only ever DT_IN_PLACE: allgather's (and the gather root's) block at recvbuf[0..n) or
   * anywhere else inside recvbuf moves to its slot first; scatter copies its own block with
   * memmove anyway, and a gather that is not the root only sends. */
  if (sb && rb) {
    char *own = rb + (size_t)r * bytes;
    if (k->kind == DT_COLL_ALLGATHER || (k->kind == DT_COLL_GATHER && r == k->root)) {
      if ((const char *)sb + bytes > rb && (const char *)sb < rb + (size_t)n * bytes) {
        if (sb != own)
          memmove(own, sb, bytes);
        sb = DT_IN_PLACE;
      }
    } else if (k->kind != DT_COLL_GATHER && k->kind != DT_COLL_SCATTER && sb == rb) {
      sb = DT_IN_PLACE;
    }
  }
  dt__coll_call kk = *k;
  kk.sbuf = sb;
  k = &kk;
  /* DTRAIN_ALGO does not apply to a call in the shared window, the automatic choice does: small
   * calls take the flat rounds (2 ranks: 4 B 0.72 -> 0.33 us, 1 KiB 0.99 -> 0.66 against the
   * window's own path, compare-peers-2026-11-26-xeon-quick-b.md), on any buffer; the fingerprint
   * still carries the window offset, so ranks that disagree on it still fail */
  const bool window = fp->flags & DT__FP_WINDOW;
  if (window)
    a = choose(k->kind, n, bytes, dt__coll_wide(k->dtype, k->op), c->ops, single_copy(c));
  /* flat: allreduce, broadcast (no sendbuf, its root), allgather, reduce_scatter; a broadcast's
   * every rank's slot carries its call, so it needs no check round */
  if (a == DT_ALGO_FLAT)
    return c->ops->flat(c->tp, k->kind, k->sbuf, rb, k->count, k->dtype, k->op, k->root, fp, deadline);
  if (window)
    return c->ops->coll_window(c->tp, k->kind, (size_t)fp->root, k->count, k->dtype, k->op, fp,
                               deadline ? deadline : dt__comm_deadline(c));
  switch (k->kind) {
  case DT_COLL_ALLREDUCE: {
    dt__tune *u = tune_class(c, k, bytes);
    if (!u)
      return allreduce_with(c, a, k, sb, rb, deadline);
    a = tune_next(u, a);
    int64_t t0 = dt_now_ns();
    DT_CHECK(allreduce_with(c, a, k, sb, rb, deadline));
    return tune_record(c, u, a, dt_now_ns() - t0, fp, deadline);
  }
  case DT_COLL_REDUCE: /* the tree checks as it goes (tree.c) */
    return dt__reduce_tree(c, sb ? sb : rb, rb, k->count, k->dtype, k->op, k->root, fp, deadline);
  case DT_COLL_BROADCAST:
    /* the shm path compares every rank's fingerprint before anything moves, the tree checks as
     * it goes (tree.c): no check round */
    if (a != DT_ALGO_TREE && a != DT_ALGO_SHM)
      DT_CHECK(dt__coll_check(c, fp, deadline));
    if (a == DT_ALGO_SHM)
      return c->ops->broadcast(c->tp, rb, k->count, k->dtype, k->root, fp, deadline);
    if (a == DT_ALGO_CHAIN)
      return dt__broadcast_chain(c, rb, bytes, k->root, fp, deadline);
    return dt__broadcast_tree(c, rb, bytes, k->root, fp, deadline);
  case DT_COLL_ALLGATHER:
    if (a == DT_ALGO_SHM)
      return c->ops->allgather(c->tp, k->sbuf, rb, k->count, k->dtype, fp, deadline);
    if (a == DT_ALGO_BRUCK)
      return dt__allgather_bruck(c, sb, rb, bytes, fp, deadline);
    return dt__allgather_ring(c, sb, rb, k->count, k->dtype, fp, deadline);
  case DT_COLL_REDUCE_SCATTER:
    if (a == DT_ALGO_SHM)
      return c->ops->reduce_scatter(c->tp, k->sbuf, rb, k->count, k->dtype, k->op, fp, deadline);
    if (a == DT_ALGO_RHD)
      return dt__reduce_scatter_rhd(c, sb ? sb : rb, rb, k->count, k->dtype, k->op, fp, deadline);
    return dt__reduce_scatter_ring(c, sb ? sb : rb, rb, k->count, k->dtype, k->op, fp, deadline);
  case DT_COLL_GATHER:
    if (n > 2)
      DT_CHECK(dt__coll_check(c, fp, deadline));
    return dt__gather_linear(c, sb ? sb : rb + (size_t)r * bytes, rb, bytes, k->root, fp, deadline);
  case DT_COLL_SCATTER:
    if (n > 2)
      DT_CHECK(dt__coll_check(c, fp, deadline));
    return dt__scatter_linear(c, sb, rb, bytes, k->root, fp, deadline);
  case DT_COLL_ALLTOALL:
    return dt__alltoall_pairwise(c, sb ? sb : rb, rb, bytes, fp, deadline);
  case DT_COLL_BARRIER:
    if (a == DT_ALGO_SHM)
      return c->ops->barrier(c->tp, fp, deadline);
    return dt__barrier_dissem(c, fp, deadline);
  default:
    return dt_set_error(DT_ERR_INVALID, "unknown collective %d", (int)k->kind);
  }
}

dt_status dt__coll_exec(dt_comm *c, const dt__coll_call *k) {
  if (dt__comm_aborted(c))
    return dt__comm_call_error(c, &k->fp, dt__comm_abort_status(c));
  dt_status st = exec_call(c, k);
  if (st == DT_OK)
    return DT_OK;
  return dt__comm_fail(c, dt__comm_call_error(c, &k->fp, st));
}

/* The element offset into the shared window (dt_comm_window) of an in-place allreduce,
 * reduce_scatter or allgather whose whole buffer lies inside it, else -1. Such a call runs the
 * window's own algorithm, and the offset joins the fingerprint, so ranks passing different
 * offsets (or one outside the window) fail as a mismatch. */
static int32_t window_offset(const dt_comm *c, dt__coll kind, const void *sbuf, const void *rbuf, size_t count,
                             dt_dtype t) {
  if (!c->win || !rbuf || count == 0 || (unsigned)t >= DT_DTYPE_COUNT || count > SIZE_MAX / 8 / (size_t)c->size ||
      (kind != DT_COLL_ALLREDUCE && kind != DT_COLL_REDUCE_SCATTER && kind != DT_COLL_ALLGATHER))
    return -1;
  size_t es = dt_dtype_size(t), span = kind == DT_COLL_ALLREDUCE ? count : count * (size_t)c->size;
  const char *own = kind == DT_COLL_ALLGATHER ? (const char *)rbuf + (size_t)c->rank * count * es : rbuf;
  if (sbuf && sbuf != DT_IN_PLACE && sbuf != own && sbuf != rbuf) /* allgather's sbuf == rbuf: exec_call */
    return -1;
  uintptr_t r = (uintptr_t)rbuf, w = (uintptr_t)c->win;
  if (r < w || r - w >= c->win_bytes || (r - w) % es || (r - w) / es > INT32_MAX ||
      span > (c->win_bytes - (r - w)) / es)
    return -1;
  return (int32_t)((r - w) / es);
}

/* Whether sbuf overlaps rbuf (on this rank, `bytes` per block) other than in the aliases comm.h
 * allows (sendbuf == recvbuf; allgather's and the gather root's block anywhere in recvbuf, moved
 * to its slot first; the scatter root's recvbuf at its own block of sendbuf): the call would
 * read what it had already written, and return a wrong result as if it were right. */
static bool bufs_clash(dt__coll kind, const void *sbuf, const void *rbuf, size_t bytes, int n, int r, bool is_root) {
  if (!sbuf || !rbuf || sbuf == rbuf)
    return false;
  size_t sn = bytes, rn = bytes;
  switch (kind) {
  case DT_COLL_ALLREDUCE:
    break;
  case DT_COLL_REDUCE:
    if (!is_root) /* recvbuf unused */
      return false;
    break;
  case DT_COLL_REDUCE_SCATTER:
    sn = bytes * (size_t)n;
    break;
  case DT_COLL_ALLTOALL:
    sn = rn = bytes * (size_t)n;
    break;
  case DT_COLL_SCATTER:
    if (!is_root || (const char *)rbuf == (const char *)sbuf + (size_t)r * bytes)
      return false;
    sn = bytes * (size_t)n;
    break;
  default: /* broadcast, barrier: no sendbuf; allgather, gather: see above */
    return false;
  }
  uintptr_t a = (uintptr_t)sbuf, b = (uintptr_t)rbuf;
  return a < b + rn && b < a + sn;
}

/* A buffer of a call that starts in the shared window but does not fit in this rank's part:
 * written past the part's end it reaches the next rank's part or the transport's own memory
 * (seen: another rank crashed), and a buffer in another rank's part races with that rank. bytes:
 * the most the call touches there. NULL if the buffer is fine; else the reason, into why. */
static const char *window_misuse(const dt_comm *c, const void *buf, size_t bytes, const char *what, char *why,
                                 size_t cap) {
  if (!buf || buf == DT_IN_PLACE)
    return NULL;
  uintptr_t b = (uintptr_t)buf, own = (uintptr_t)c->win;
  if (b - own < c->win_bytes) { /* the common case, the trainer's: in this rank's own part */
    if (bytes <= c->win_bytes - (b - own))
      return NULL;
    snprintf(why, cap, "%s starts %zu bytes into this rank's shared window of %zu bytes but the call covers %zu "
             "bytes from there", what, (size_t)(b - own), c->win_bytes, bytes);
    return why;
  }
  for (int r = 0; r < c->size; r++) {
    uintptr_t p = (uintptr_t)dt_comm_window_part(c, r);
    if (r != c->rank && p && b >= p && b - p < c->win_bytes) {
      snprintf(why, cap, "%s lies in rank %d's part of the shared window (each rank calls on its own part)", what, r);
      return why;
    }
  }
  return NULL;
}

dt_status dt__coll_prepare(dt_comm *c, dt__coll kind, const void *sbuf, void *rbuf, size_t count, dt_dtype t,
                           dt_op op, int root, dt__coll_call *k) {
  const char *name = dt__coll_name(kind);
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "%s: communicator is NULL", name);
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->sbuf = sbuf;
  k->rbuf = rbuf;
  k->count = count;
  k->dtype = t;
  k->op = op;
  k->root = root;
  k->fp.seq = ++c->seq;
  k->fp.count = count;
  k->fp.coll = (uint8_t)kind;
  k->fp.dtype = (uint8_t)t;
  k->fp.op = (uint8_t)op;
  k->fp.root = root;
  int32_t off = window_offset(c, kind, sbuf, rbuf, count, t);
  if (off >= 0) {
    k->fp.flags = DT__FP_WINDOW;
    k->fp.root = off;
  }
  const char *bad = NULL;
  char why[160];
  int has_op = kind == DT_COLL_ALLREDUCE || kind == DT_COLL_REDUCE || kind == DT_COLL_REDUCE_SCATTER;
  int rooted = kind == DT_COLL_REDUCE || kind == DT_COLL_BROADCAST || kind == DT_COLL_GATHER || kind == DT_COLL_SCATTER;
  int is_root = rooted && root == c->rank;
  if (kind != DT_COLL_BARRIER && (unsigned)t >= DT_DTYPE_COUNT) {
    snprintf(why, sizeof why, "dtype %d is not a dt_dtype", (int)t);
    bad = why;
  } else if (has_op && (unsigned)op >= DT_OP_COUNT) {
    snprintf(why, sizeof why, "op %d is not a dt_op", (int)op);
    bad = why;
  } else if (rooted && (root < 0 || root >= c->size)) {
    snprintf(why, sizeof why, "root %d is not a rank of this communicator (size %d)", root, c->size);
    bad = why;
  } else if (count > 0 && count > SIZE_MAX / 8 / (size_t)c->size) {
    snprintf(why, sizeof why, "count %zu is too large", count);
    bad = why;
  } else if (count > 0) {
    switch (kind) {
    case DT_COLL_REDUCE:
      if (is_root && !rbuf)
        bad = "recvbuf is NULL on the root";
      else if (!is_root && !sbuf && !rbuf)
        bad = "sendbuf is NULL (in place needs recvbuf)";
      break;
    case DT_COLL_GATHER:
      if ((is_root || !sbuf) && !rbuf)
        bad = is_root ? "recvbuf is NULL on the root" : "sendbuf is NULL (in place needs recvbuf)";
      break;
    case DT_COLL_SCATTER:
      if (is_root && !sbuf)
        bad = "sendbuf is NULL on the root";
      else if (!rbuf)
        bad = "recvbuf is NULL";
      break;
    case DT_COLL_BARRIER:
      break;
    default:
      if (!rbuf)
        bad = kind == DT_COLL_BROADCAST ? "buf is NULL" : "recvbuf is NULL";
      break;
    }
    if (!bad && bufs_clash(kind, sbuf, rbuf, count * dt_dtype_size(t), c->size, c->rank, is_root))
      bad = "sendbuf and recvbuf overlap without being the same buffer (DT_IN_PLACE works in place)";
    if (!bad && c->win) { /* the most each buffer may cover: n blocks where a call has them */
      size_t one = count * dt_dtype_size(t), all = one * (size_t)c->size;
      bool s_all = kind == DT_COLL_REDUCE_SCATTER || kind == DT_COLL_ALLTOALL || kind == DT_COLL_SCATTER;
      bool r_all = kind == DT_COLL_ALLGATHER || kind == DT_COLL_ALLTOALL || kind == DT_COLL_GATHER ||
                   (kind == DT_COLL_REDUCE_SCATTER && sbuf == DT_IN_PLACE);
      bad = window_misuse(c, rbuf, r_all ? all : one, kind == DT_COLL_BROADCAST ? "buf" : "recvbuf", why, sizeof why);
      if (!bad)
        bad = window_misuse(c, sbuf, s_all ? all : one, "sendbuf", why, sizeof why);
    }
  }
  if (!bad)
    return DT_OK;
  char me[64];
  dt__comm_peer_name(c, c->rank, me, sizeof me);
  if (bad == why)
    dt_set_error(DT_ERR_INVALID, "%s: %s #%llu: %s", me, name, (unsigned long long)k->fp.seq, bad);
  else {
    char what[160];
    dt__fp_format(&k->fp, what, sizeof what);
    dt_set_error(DT_ERR_INVALID, "%s: %s: %s", me, what, bad);
  }
  return dt__comm_fail(c, DT_ERR_INVALID);
}

dt_status dt__comm_enter(dt_comm *c, dt__coll kind) {
  if (c && atomic_exchange_explicit(&c->in_call, 1, memory_order_acquire))
    return dt_set_error(DT_ERR_STATE, "rank %d: %s while another thread of this process is in a call on the same "
                        "communicator (one thread at a time: dtrain/comm.h)", c->rank, dt__coll_name(kind));
  return DT_OK;
}

void dt__comm_leave(dt_comm *c) {
  if (c)
    atomic_store_explicit(&c->in_call, 0, memory_order_release);
}

#define RUN(kind, s, r, cnt, t, op, root)                                    \
  do {                                                                       \
    DT_CHECK(dt__comm_enter(c, kind));                                       \
    dt__coll_call call_;                                                     \
    dt_status st_ = dt__coll_prepare(c, kind, s, r, cnt, t, op, root, &call_); \
    if (st_ == DT_OK)                                                        \
      st_ = dt__progress_run(c, &call_);                                     \
    dt__comm_leave(c);                                                       \
    return st_;                                                              \
  } while (0)

dt_status dt_comm_allreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op) {
  RUN(DT_COLL_ALLREDUCE, sendbuf, recvbuf, count, t, op, -1);
}

dt_status dt_comm_reduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, dt_op op,
                         int root) {
  RUN(DT_COLL_REDUCE, sendbuf, recvbuf, count, t, op, root);
}

dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
  RUN(DT_COLL_BROADCAST, NULL, buf, count, t, 0, root);
}

dt_status dt_comm_allgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t) {
  RUN(DT_COLL_ALLGATHER, sendbuf, recvbuf, count, t, 0, -1);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t,
                                 dt_op op) {
  RUN(DT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, count, t, op, -1);
}

dt_status dt_comm_gather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root) {
  RUN(DT_COLL_GATHER, sendbuf, recvbuf, count, t, 0, root);
}

dt_status dt_comm_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t, int root) {
  RUN(DT_COLL_SCATTER, sendbuf, recvbuf, count, t, 0, root);
}

dt_status dt_comm_alltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype t) {
  RUN(DT_COLL_ALLTOALL, sendbuf, recvbuf, count, t, 0, -1);
}

dt_status dt_comm_barrier(dt_comm *c) { RUN(DT_COLL_BARRIER, NULL, NULL, 0, DT_U8, 0, -1); }

/* What a rank asks dt_comm_window for, as the ranks exchange it: the bytes, or this when its
 * own call is refused (bad arguments, or a window already: every rank has one or none). */
#define WIN_REFUSED (-1)

dt_status dt_comm_window(dt_comm *c, size_t bytes, void **out) {
  if (out)
    *out = NULL;
  if (!c)
    return dt_set_error(DT_ERR_INVALID, "dt_comm_window: communicator is NULL");
  if (c->size < 2 || !c->ops->window) /* the same on every rank: nothing to tell each other */
    return dt_set_error(DT_ERR_UNSUPPORTED, "dt_comm_window: transport %s with %d rank%s shares no memory",
                        c->ops->name, c->size, c->size == 1 ? "" : "s");
  /* Every rank's request goes round first, by an allgather checked like any collective: a rank
   * in another call is a mismatch at once, and bad arguments or a second window on any rank, or
   * different sizes, fail the call on every rank at once, naming that rank, before any memory is
   * made. Those leave the communicator usable (a later window may succeed). */
  const bool bad = !out || bytes == 0 || bytes > ((size_t)1 << 40);
  int64_t mine = bad || c->win ? WIN_REFUSED : (int64_t)bytes;
  int64_t *all = dt__calloc(sizeof *all * (size_t)c->size);
  if (!all) /* fails the job: the others, in the exchange, learn why at once */
    return dt__comm_fail(c, dt__error_prefix(DT_ERR_NOMEM, "dt_comm_window: %d ranks' requests", c->size));
  dt_status st = dt_comm_allgather(c, &mine, all, 1, DT_I64);
  if (st != DT_OK) {
    dt__free(all);
    return st;
  }
  int other = -1, differs = -1;
  for (int r = 0; r < c->size; r++) {
    if (r != c->rank && all[r] < 0 && other < 0)
      other = r;
    if (all[r] != all[0] && differs < 0)
      differs = r;
  }
  if (bad)
    st = dt_set_error(DT_ERR_INVALID, out ? "dt_comm_window: %zu bytes (1 byte to 1 TiB)" : "dt_comm_window: out is NULL",
                      bytes);
  else if (mine == WIN_REFUSED)
    st = dt_set_error(DT_ERR_STATE, "dt_comm_window: this communicator has a window already");
  else if (other >= 0)
    st = dt_set_error(DT_ERR_INVALID, "dt_comm_window: rank %d refused the call (its own error says why)", other);
  else if (differs >= 0)
    st = dt_set_error(DT_ERR_MISMATCH, "dt_comm_window: rank %d asked for %lld bytes per rank, rank 0 for %lld", differs,
                      (long long)all[differs], (long long)all[0]);
  dt__free(all);
  if (st != DT_OK)
    return st;
  dt__progress_drain(c); /* nothing of ours runs on the transport meanwhile */
  bytes = (bytes + 63) / 64 * 64;
  void *w = NULL;
  pthread_mutex_lock(&c->lock);
  st = c->ops->window(c->tp, bytes, &w, dt__comm_deadline(c));
  pthread_mutex_unlock(&c->lock);
  /* a rank or the store gone, or the job failed, meanwhile: name the job's failure, as calls do */
  if (st == DT_ERR_PEER || st == DT_ERR_ABORTED)
    return dt__comm_fail(c, st);
  if (st != DT_OK)
    return st;
  c->win = w;
  c->win_bytes = bytes;
  *out = w;
  return DT_OK;
}

void *dt_comm_window_part(const dt_comm *c, int rank) {
  if (!c || !c->win || rank < 0 || rank >= c->size)
    return NULL;
  return c->ops->window_part(c->tp, rank);
}
