/* shm.c - the shared-memory transport: every rank of a communicator on one host maps one POSIX
 * shared-memory segment holding
 *   - a header (parameters, a futex "bell" rung whenever anything is published),
 *   - one record per rank (pid for liveness, progress counters of the fast paths, and the
 *     collective call it is in, so mismatched calls are reported instead of waited out),
 *   - one single-producer single-consumer ring per ordered pair of ranks for sendrecv (slots
 *     carry the fingerprint, the message length and the piece's offset),
 *   - two staging buffers per rank for the collectives made for shared memory (allreduce,
 *     broadcast, allgather, reduce_scatter),
 *   - two flat slots per rank, one line of round number and fingerprint and a small piece of data,
 *     for small collectives and the barrier (a round with no data).
 * The segment's name is unlinked as soon as every rank mapped it, so nothing leaks even if a
 * rank is SIGKILLed later.
 *
 * Waiting spins, then yields, then sleeps on a futex bell with a short timeout; with more ranks
 * on the host than CPUs it yields at once instead of spinning (see SHM_SPIN_NS). While waiting
 * it watches the job's abort state, the deadline, and every ~50 ms whether the awaited ranks'
 * processes still exist.
 *
 * From SHM_DEFAULT_CMA bytes the allreduce, and from SHM_DEFAULT_CMA_MOVE bytes per rank the
 * allgather and broadcast, copy once, straight between
 * the ranks' own buffers (process_vm_readv/writev, "cross-memory attach"), instead of through the
 * staging buffers, when rank 0 found at setup that it may (same user, no ptrace restriction) and
 * that it is fast here (shm_cma_fast). Which of the two paths runs is then timed per size class
 * while the job runs (SHM_TUNE_CLASSES). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "comm/coll/coll.h"
#include "comm/comm.h"
#include "comm/shm/tune.h"

#define SHM_MAGIC 0x314D485354524E44ull /* "DNRTSHM1" */
#define SHM_LINE 64
/* Ring slots: 4 x 256 KiB per ordered pair keeps a sender a few pieces ahead of its receiver
 * while each piece still fits in L2. DTRAIN_SHM_SLOT / DTRAIN_SHM_SLOTS override. */
#define SHM_DEFAULT_SLOT (256u << 10)
#define SHM_DEFAULT_NSLOTS 4
#define SHM_RINGS_MAX ((uint64_t)256 << 20)
/* Allreduce chunk: each rank reduces 1/n of it, so 512 KiB keeps a rank's working set (its
 * slice of every rank's chunk) in L2 for 2-4 ranks. DTRAIN_SHM_CHUNK overrides. */
#define SHM_DEFAULT_CHUNK (512u << 10)
/* Flat allreduce slot: the largest piece one round moves (per rank, two slots by parity).
 * DTRAIN_SHM_FLAT overrides; choose() in collectives.c says up to where flat is used. */
#define SHM_DEFAULT_FLAT (32u << 10)
/* Single-copy collectives (process_vm_readv/writev) from this many bytes per rank's buffer; below,
 * the staging buffers or the flat slots. Measured 2026-11-27 on the Xeon guest, 2 ranks, `dtrain
 * bench <coll> -n 2 --transport shm --algo {shm,flat} --sizes 4K:256K --iters 100` with
 * DTRAIN_SHM_CMA=1 or off, three runs (bench/results/cma-2026-11-27-xeon.txt): allreduce single
 * 9.2-9.3 us at 64 KiB against the staged 10.1-10.2, level at 32 KiB, behind below (3.7 against
 * 1.7-1.8 at 4 KiB: two waits for every rank and the system calls); broadcast 5.8-7.8 at 64 KiB
 * against flat's 7.2-7.7, 4.2-5.3 against 5.1-5.5 at 32 KiB; allgather ahead from 128 KiB blocks
 * (below that the flat slots take it anyway). From 64 KiB to 64 MiB: allreduce 1.2-1.5x faster
 * at 128 KiB-4 MiB, 1.1x at 64 MiB; allgather 1.2-1.7x at 128 KiB-2 MiB, level to 1.1x above.
 * DTRAIN_SHM_CMA=B or off overrides (for all three: allgather and broadcast below too). Unset,
 * the allreduce from this size takes the single copy or the staging buffers as rank 0 times them
 * (SHM_TUNE_CLASSES); set, the single copy always. */
#define SHM_DEFAULT_CMA (64u << 10)
/* Allgather and broadcast copy once from this many bytes per rank (an allgather's block, a
 * broadcast's buffer): they only move data, and one copy replaces two (into a slot, out of it).
 * Measured 2026-11-29 on an Intel Xeon guest with AVX512-FP16 (2 vCPUs), `dtrain bench
 * {allgather,broadcast} -n 2 --transport shm [--algo flat] --sizes 8K:512K --iters 300 --warmup
 * 30 [--fresh]` (the auto choice taking the single copies from 16 KiB), two rounds
 * (bench/results/cma-small-2026-11-29-xeon.txt, section 4, with dt__copy on memcpy): single
 * copies led from 16 KiB blocks (allgather 2.1-2.2 us at 32 KiB gathered against the flat slots'
 * 3.7-4.1, 3.3-3.5 against 6.5-7.0 at 64 KiB; on freshly written inputs level or 10% behind
 * there, ahead from 128 KiB gathered) and for broadcast from 16 KiB (2.4-2.9 / 3.5-3.8 us at 16 / 32 KiB against
 * 3.0-3.4 / 5.3-5.8, reused or fresh). On the Cascade Lake guest of 2026-11-27
 * (bench/results/cma-2026-11-27-xeon.txt, last sections) the flat slots still led below 16 KiB
 * (broadcast 1.7-2.0 us at 8 KiB against 2.8-3.8) and single copies drew level at 16-32 KiB:
 * from 16 KiB, where neither host loses much and this one gains 2-3x. AMD CPUs kept 64 KiB until
 * 2026-12-01, because the Zen 3 EPYC guest's flat slots had moved 16 KiB in 1.3-1.5 us (a figure
 * set against the Xeon's single copies, never against that host's own); on an EPYC Zen 4 guest
 * (family 25 model 17) the flat slots took 2.4-5.3 us at 16 KiB and 4.6-7.9 at 32 KiB, the single
 * copy 2.3-3.8 and 3.3-4.9 (allgather blocks and broadcasts, reused buffers, three alternated
 * rounds; fresh ones alike: bench/results/cma-move-2026-12-01-zen4.txt), so every CPU now takes
 * it from 16 KiB. */
#define SHM_DEFAULT_CMA_MOVE (16u << 10)
/* With more ranks on the host than CPUs, the single copies start here for every collective, and
 * the choice is timed as without (SHM_TUNE_CLASSES). Below it they cost more than they save: 4
 * ranks on 2 cores, 64 KiB allreduce 66-71 us against the staging buffers' 36-39. Above it, which
 * path wins flips with the host's state: on the EPYC Zen 4 guest, 4 ranks on its 2 CPUs,
 * `dtrain bench {broadcast,allreduce,allgather} -n 4 --transport shm --iters 5 --warmup 3`
 * alternated with DTRAIN_SHM_CMA=65536 (2026-12-06, bench/results/over-cma-2026-12-06-zen4.txt),
 * the staging buffers ran in a fast state and a slow one 2-3x slower, flipping from run to run
 * and within one, while the single copy ran alike in both: broadcast of 64 MiB 12.9-14.5 ms or
 * 35.7-36.7 against the single copy's 9.7-14.2, allreduce 19.8 or 52.7-55.9 against 23.3-24.5;
 * from 4 MiB the single copy ran 0.61-1.44x the staging buffers' speed in their fast state
 * (allreduce 0.61-0.90x, allgather 0.71-1.08x) and 1.2-3.7x in their slow one. Timed, against
 * the staging buffers alone, 40 calls per size: broadcast 0.93-1.12x in their fast state and
 * 2.4-4.3x in the slow one, allreduce 1.7-2.9x in the slow state and 0.58-1.25x in the fast one
 * (a timing taken while the host was slow holds until the class's next), allgather 0.88-1.24x but
 * in two pairs (0.33-0.43x; 2.18x). Until then the single copies were off with more ranks than
 * CPUs unless DTRAIN_SHM_CMA asked. */
#define SHM_OVER_CMA (4u << 20)
/* The allreduce writes its output with non-temporal stores (dt__copy_nt) once the call's
 * footprint, every local rank's input and output (2 x n x bytes), reaches this: there the output
 * leaves the caches anyway, and a plain store would first read each line from memory. Measured
 * 2026-11-29 on an Intel Xeon guest with AVX512-FP16 (2 vCPUs), three alternated rounds of
 * `DTRAIN_SHM_NT={off,default} dtrain bench allreduce -n {2,4} --transport shm --sizes 1M:256M
 * --iters 10 --warmup 3` (bench/results/nt-out-2026-11-29-xeon.txt): 2 ranks (single copy) 256
 * MiB 45.2-45.8 ms against 50.4-51.1, 64 MiB 10.7-11.3 against 11.7-12.5, 32 MiB 3.8-4.5 against
 * 4.5-4.9, mixed at 16 MiB; 4 ranks on the 2 cores (staged) 16-20% faster from 16 MiB (256 MiB
 * 106-107 against 129-130), level at 8 MiB. A one-off build streaming the single copy's output
 * at every size ran 2 ranks 4-10% slower at 2-8 MiB, where a rank's buffers stay cached from call
 * to call (bench/results/probes-2026-11-29-xeon.txt, section 5); with inputs rewritten before
 * every call (`--fresh`), streaming from a 2 MiB footprint was 1.2-2x slower at 512 KiB-8 MiB
 * too (bench/results/probes-2026-11-29b-xeon.txt, section 5). Not on AMD CPUs: on the Zen 3
 * EPYC guest the single copy streaming its output from the last-level cache's size was level to
 * 3% slower at 64-256 MiB (docs/BENCHMARKS-LOG.md, "Writing the allreduce's output around the
 * caches"). DTRAIN_SHM_NT=B or off overrides. */
#define SHM_DEFAULT_NT ((uint64_t)64 << 20)
/* Streaming its output, the single-copy allreduce steps this many chunks at a time (one system
 * call per peer and direction per step). Same host, three alternated rounds of a build stepping
 * 1, 2 or 4 chunks of 512 KiB, `dtrain bench allreduce -n 2 --transport shm --sizes 16M:256M
 * --iters 10 --warmup 3`: 2 chunks 10.9-11.5 ms at 64 MiB against 11.3-11.9, 44.5-45.8 at 256
 * MiB against 45.7-46.3; 4 chunks slower than 1 from 16 MiB
 * (bench/results/nt-out-2026-11-29-xeon.txt). */
#define SHM_NT_CHUNKS 2
/* Writing its output into the caches (shm_nt_use false), the single-copy allreduce steps 1 chunk
 * at a time, or SHM_ZEN5_CHUNKS on AMD family 26 (Zen 5): each step costs a process_vm_readv and
 * a process_vm_writev per other rank, each a system call (about 1 us on the Zen 5 guest) that
 * looks up the other process and pins its pages anew, and there fewer of them made the call
 * faster (the other rank's slice of a 2 MiB step, 1 MiB, still fits the core's L2). 2 ranks,
 * `dtrain bench allreduce -n 2 --transport shm`, 12 jobs of each build alternated, medians of the per-pair
 * ratios: 1.10-1.15x at 2-32 MiB and 1.04-1.11x at 64-256 MiB; in one-binary trials 1.03-1.12x
 * at 2-16 MiB with `--fresh`, and 4 ranks on the 2 vCPUs 0.99-1.12x at 4-64 MiB
 * (bench/results/cma-step-2026-12-07h-zen5.txt). On the EPYC Zen 3 (family 25 model 1) steps of
 * 2, 4 and 8 chunks were level with 1 (medians of 8 rounds 0.91-1.22x at 1-256 MiB, each size's
 * rounds spreading 0.6-1.7x; bench/results/cma-step-2026-12-07i-zen3.txt), so it keeps 1. Not
 * measured elsewhere; on the Xeon with AVX512-FP16 the streamed output's step of 4 chunks had
 * been slower than 1 (SHM_NT_CHUNKS). */
#define SHM_ZEN5_CHUNKS 4
/* Two ranks, each with a CPU of its own: the single-copy allreduce hands the pieces each rank
 * reduces to it through a pipe instead of process_vm_readv. At the call's start each rank
 * vmsplice(2)s the other's slice of every chunk of its input into the other's pipe (the kernel
 * only takes references to the pages, through the fast page-table walk of the caller's own
 * memory), and the other read(2)s them out chunk by chunk: one copy, as before, without
 * process_vm_readv's slow pinning of another process's pages (half of its kernel time in a
 * profile on an EPYC Zen 4 guest). The results still go back with process_vm_writev: spliced too,
 * the receiver's copy met lines just written on the other core, and 6 runs in 9 ran 3-4x slower.
 * Only while every piece fits in the pipes at once (1 MiB each, the default most an unprivileged
 * process may make: calls up to just under 2 MiB): no splice then waits for the reader, and no
 * chunk waits for the other rank. Measured on that guest, 2026-12-02 (bench/results/pipe-2026-12-02-zen4.txt):
 * `bench/cma_bw` 512 KiB 30-32 us for vmsplice plus read against 40-49 for process_vm_readv; the
 * allreduce 1.13x faster at 256 KiB-1.5 MiB (medians of 10-20 alternated pairs of `dtrain bench
 * allreduce -n 2 --transport shm`, quartiles 1.09-1.15; 1.11x at 1 MiB with inputs rewritten before
 * every call), level at 64 KiB. The allgather's blocks go the same way, spliced by their owner and
 * read by the other, up to 1 MiB less a page: 1.31-1.43x faster than process_vm_writev at 32-512
 * KiB blocks, reused or rewritten (8 alternated pairs each; level at 16 KiB). Each rank holds both
 * ends of the other's pipe (pidfd_getfd(2), which
 * needs the same permission as process_vm_readv), so a pipe always has a reader (no SIGPIPE) and
 * never reaches end-of-file. Not with more ranks, where the single copies never wait between
 * chunks. By default only on Zen 4 CPUs (dt__cpu_zen4), the only ones where the pipes were
 * measured faster. On a Zen 5 guest (family 26 model 2, the same kernel) `bench/cma_bw` moved 12
 * GB/s through a pipe against 18 with process_vm_readv at 1 MiB (8 against 14 at 64 KiB), and the
 * pipes made the 2-rank allreduce 1.20-1.26x slower at 64 KiB-1 MiB and the allgather 1.18-1.67x
 * slower at 32-512 KiB blocks (medians of 5 alternated rounds; docs/BENCHMARKS-LOG.md, "A Zen 5
 * host with twice the memory bandwidth"). A probe within rank 0 alone (splicing into its own pipe
 * and reading it back, against process_vm_readv of its own memory) could not tell: it found the
 * pipes faster on that host too (10.6-12.6 against 11.7-14.2 us per 256 KiB), so what costs there
 * is presumably the pages passing between two processes on two cores. On an EPYC Zen 3 (family
 * 25 model 1) the pipes ran the 2-rank allreduce 0.90-1.03x as fast at 64 KiB-2 MiB (medians of 8
 * alternated rounds, bench/results/nt-pipe-2026-12-07i-zen3.txt). DTRAIN_SHM_PIPE=on takes the
 * pipes on any CPU, off keeps process_vm_readv. */
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
/* Huge pages for the callers' large buffers: a buffer of at least SHM_THP_MIN bytes that a
 * single-copy collective meets a second time (same address and length, among the last
 * SHM_THP_SEEN met: a training step's buckets) has its whole 2 MiB pages collapsed onto
 * transparent huge pages (madvise(MADV_COLLAPSE), Linux 6.1; the contents stay as they are),
 * once, at most SHM_THP_STEP bytes per call (so that no call of a huge buffer stalls its peers
 * for long: the rest follows at the next meetings; DTRAIN_SHM_THP=B sets another step). The
 * 2-rank allreduce of 16-256 MiB of malloc'd memory then took 3.4-3.7 ms instead of 4.6-7.4 at 16 MiB and 12-15
 * instead of 20-25 at 64 MiB on the EPYC guest (BENCHMARKS-LOG, "Collapsing the callers' buffers");
 * the collapse itself took 24 ms to 1 s per 64-256 MiB there, paid once per buffer, which is why
 * a buffer met only once is left alone. Then the 2 MiB pages its two ends lie in too, where its
 * mapping holds them whole (the kernel collapses no others; what lies around the buffer there
 * keeps its contents, and may take up to 2 MiB more memory per end): a malloc'd buffer rarely
 * starts on a 2 MiB boundary, and each small page left costs its pinning in every call. EPYC Zen
 * 3 guest, 2026-12-07, `dtrain bench allreduce -n 2 --transport shm --sizes 1M:16M --iters 20`,
 * six rounds alternated with the build before (medians): 2 MiB 476 -> 337 us, 4 MiB 1,106 ->
 * 808, 8 MiB 2,054 -> 1,859, 16 MiB level (bench/results/thp-ends-2026-12-07-zen3.txt); a 4 MiB
 * call on buffers wholly on huge pages (--hugepages) took 514-766 us there, on small pages
 * 671-1,111. From 2 MiB, which may hold no whole huge page but lies in at most two.
 * DTRAIN_SHM_THP=off leaves all memory alone, as does a host whose transparent huge pages are
 * "never". */
#define SHM_THP_MIN (2u << 20)
#define SHM_THP_SEEN 64
/* Two-path allreduce, chosen by measurement while the job runs. From cma_min bytes the
 * allreduce has two paths: the single copy (process_vm_readv/writev, or the pipes) and the
 * staging buffers. Which is faster changes on one host from minute to minute: on the Zen 5
 * guest of 2026-12-03, 2 ranks, `dtrain bench allreduce -n 2 --transport shm --sizes 128K:64M`
 * with DTRAIN_SHM_CMA=off alternated with the default, the staging buffers took 32 / 61 / 116
 * us at 256 KiB / 512 KiB / 1 MiB against the single copy's 19 / 36 / 80 at 06:10 UTC, and 11.4
 * / 25 / 52 against 15-18 / 30-33 / 63-68 at 06:25 (6.6-6.9 ms against 7.8 at 64 MiB)
 * (bench/results/tune-2026-12-03-zen5.txt). So rank 0 times its calls per size class (powers of
 * two from 64 KiB) and takes the path whose least time per byte over its last timed calls is
 * lower (tune.h; the first calls after a switch pay for it). A class starts on the single
 * copy, as before there was a choice, and times the staging buffers after
 * DT__SHM_TUNE_FIRST calls: a class's first calls on new buffers run slow on either path (page
 * faults, huge pages collapsed, the single copy's first calls 2-3x its later ones), and a
 * benchmark of a few calls per size (compare-peers makes 6 at 64-256 MiB) then meets the path it
 * met before. The slower path is timed again, three calls of it in a row, at the class's 16th,
 * 32nd, 64th, 128th and 256th call and every DT__SHM_TUNE_EVERY calls: three calls of a path
 * twice as slow, and the first calls back on the faster one, cost about 1% from there. A path
 * found three or more times slower skips the next of those points (tune.h, DT__SHM_TUNE_FAR).
 * Every rank must take the same path in a call: rank 0 publishes each class's choice in the
 * segment's header (shm_hdr.plan) with the call number from which it holds (see shm_tune_pick).
 * Both paths reduce in the same order (own slice first, then the others in rank order): the
 * same bits whichever runs. DTRAIN_SHM_CMA (a size, or off) fixes the choice. */
#define SHM_TUNE_CLASSES 16
/* The broadcast and the allgather have the same two paths from cma_move_min bytes (per rank's
 * block), and the same choice by time: on the Zen 5 guest (a system call costs about 1 us there,
 * kernel page-table isolation on), 2 ranks, the staging buffers broadcast 16 KiB / 64 KiB in 1.9 /
 * 4.8 us against the single copy's 4.8-5.0 / 7.8-8.5 and 2 MiB in 82 against 90-92, the single
 * copy 4 MiB in 135-138 against 192-194; the staging buffers allgathered 32 KiB / 2 MiB in 2.2-2.7
 * / 75-81 us against 5.7-6.0 / 89-102, where on the Zen 4 and the Xeon guests the single copy led
 * from 16 KiB (SHM_DEFAULT_CMA_MOVE). The timed choice ran within the faster path's spread or
 * near it at every size (bench/results/move-tune-2026-12-06-zen5.txt). Size classes are powers of
 * two from 16 KiB. Their time is the slowest rank's, not rank 0's: the staged broadcast's root
 * leaves as soon as its copy is in, before the others copied it out. So every rank publishes its
 * time of each such call (shm_rank.took), and rank 0 records call c - 1 at the end of call c
 * (shm_move_took). */
enum { SHM_TUNE_ALLREDUCE, SHM_TUNE_BROADCAST, SHM_TUNE_ALLGATHER, SHM_TUNE_KINDS };
#define SHM_TOOK 4 /* calls of a kind whose times a rank keeps published (round robin) */
#define SHM_THP_STEP ((size_t)256 << 20)
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels refuse it with EINVAL, which is only a lost hint */
#endif
/* Waiting: spin (pause) for a while, then yield for a while, then sleep on a futex bell.
 * How long depends on whether this host runs more ranks than the CPUs they may use together
 * (dt_comm.host_cpus: the union of their affinities, so ranks mpirun bound to a core each are not
 * oversubscribed):
 *   - not oversubscribed: every rank has a core, so spinning costs nobody and a peer that is
 *     late was descheduled by someone else's process; keep spinning SHM_SPIN_NS so that both
 *     ranks stay on their cores and the next rounds run back to back. (Measured: 2 ranks, 4 B,
 *     with the other helpers' builds loading the 2-core guest to load average 9-14: with a 3 us
 *     spin then yields, dtrain took 20 us a call against Open MPI's 0.24 us, which polls without
 *     ever yielding. A 1 ms spin still fell into sleeps at 16-64 KiB, 0.7-4 ms a call, as a
 *     descheduled peer returns only after another program's time slice; 10 ms kept every size
 *     from 4 B to 64 KiB at 0.2-12 us in the same conditions.)
 *   - oversubscribed: the rank we wait for may need our core: no spinning; sched_yield hands
 *     the core to it at once, for up to SHM_YIELD_OVER_NS, then the futex. (Measured: 4 ranks,
 *     4 B, `dtrain bench allreduce -n 4 --transport shm --iters 500`, five alternating runs at
 *     load average 13: medians 15.0 us when sleeping after 4 yields, 13.0 after 64, 10.5 when
 *     only yielding; Open MPI, which only yields, 7-13 us in the same hour.)
 *   - on a progress thread (a nonblocking collective overlapping the caller's computation, as
 *     the trainer's gradient buckets do): the core we would spin on is the caller's, who has
 *     work; spin at most SHM_SPIN_BG_NS, no yielding, then the futex. (Measured: 2-worker mlp
 *     training, 1 thread each, 200 steps at load 7-16: with the 10 ms spin the overlapped
 *     allreduce starved the backward next to it, 957-7,488 samples/s and 85-88% exposed
 *     communication; with a 50 us spin and no yield 6,256-8,816 samples/s, 34-43%.)
 * DTRAIN_SHM_SPIN_US / DTRAIN_SHM_YIELD_US override the first two. */
#define SHM_SPIN_NS 10000000
#define SHM_YIELD_NS 1000000
#define SHM_SPIN_OVER_NS 0
#define SHM_YIELD_OVER_NS 5000000
#define SHM_SPIN_BG_NS 50000
#define SHM_SLEEP_NS 2000000 /* futex sleep: 2 ms bounds any missed wake-up */
#define SHM_ALIVE_NS 50000000 /* liveness check of awaited ranks: 50 ms */

enum { SHM_DATA = 1, SHM_NACK = 2 };

typedef struct shm_hdr {
  uint64_t magic;
  uint64_t size;
  uint32_t n, nslots;
  uint64_t slot_bytes, chunk_bytes;
  uint64_t off_ranks, off_rings, off_stage, ring_bytes;
  uint64_t off_flat, flat_bytes, flat_stride;
  uint64_t cma_min;      /* single-copy allreduce from this many bytes; 0: never */
  uint64_t cma_move_min; /* single-copy allgather and broadcast from this many bytes per rank */
  uint64_t nt_min;       /* allreduce outputs streamed from this footprint (SHM_DEFAULT_NT); 0: never */
  uint64_t cma_chunks;   /* chunks per step of the single-copy allreduce when not streaming */
  uint64_t owner_addr; /* where rank 0 maps this header, and its pid: the others' probe */
  int32_t owner_pid;
  int32_t owner_pipe[2]; /* two ranks: rank 0's incoming pipe (read end, write end), or -1 */
  alignas(SHM_LINE) _Atomic uint32_t bell;
  _Atomic uint32_t sleepers;
  alignas(SHM_LINE) _Atomic uint32_t cma; /* rank 0's verdict: 0 not yet, 1 may copy once, 2 may not */
  _Atomic uint32_t pipe; /* rank 0's verdict on the pipes (SHM_PIPE), stored before cma: 1 yes, else no */
  _Atomic uint32_t tune; /* rank 0's verdict, stored before cma: 1 the allreduce's path is measured */
  /* per collective (SHM_TUNE_KINDS) and size class (SHM_TUNE_CLASSES): from that collective's
   * call (bits 2..) on, the path bit 0 says, before it the one bit 1 says (1: the staging
   * buffers); written by rank 0 only */
  alignas(SHM_LINE) _Atomic uint64_t plan[SHM_TUNE_KINDS][SHM_TUNE_CLASSES];
} shm_hdr;

/* One rank's record; each counter on its own line since different ranks poll them. */
typedef struct shm_rank {
  alignas(SHM_LINE) _Atomic int32_t pid;
  _Atomic int32_t left; /* 1 once this rank destroyed its communicator: it publishes nothing more */
  alignas(SHM_LINE) _Atomic uint64_t in_seq;  /* allreduce chunks copied into staging */
  alignas(SHM_LINE) _Atomic uint64_t red_seq; /* allreduce chunks whose slice is reduced */
  alignas(SHM_LINE) _Atomic uint64_t out_seq; /* allreduce chunks copied out */
  /* This rank's own futex bell, rung when it publishes and someone sleeps on it: a waiter for
   * one rank's progress sleeps here, so a publication wakes only the ranks waiting for it. */
  alignas(SHM_LINE) _Atomic uint32_t bell;
  _Atomic uint32_t sleepers;
  alignas(SHM_LINE) dt__fp fp[2];             /* fingerprint per staging buffer */
  /* The call this rank is in (seqlock: odd version = being written), so a rank waiting for it
   * can tell "slow" from "in a different call" and report a mismatch instead of a timeout. */
  alignas(SHM_LINE) _Atomic uint32_t cur_ver;
  _Atomic uint64_t cur_fp[3]; /* the dt__fp's 24 bytes, as words (all accesses seq_cst) */
  /* Window collectives (shm_coll_window): win_in = g once this rank's range of call g is in its
   * window (win_fp says which call), win_out = g once it did its part of the call. */
  alignas(SHM_LINE) _Atomic uint64_t win_in;
  dt__fp win_fp;
  alignas(SHM_LINE) _Atomic uint64_t win_out;
  /* Single-copy collectives: the call's buffers as addresses in this rank's process, written
   * before in_seq is published for the call and read by the others after they saw it. */
  alignas(SHM_LINE) uint64_t cma_in, cma_out;
  /* cma_go = g once this rank may touch the others' buffers in call g (written every call);
   * cma_quit = g once it leaves call g failed (read by the others every call, so on a line of
   * its own); shm_cma_begin, shm_cma_drain */
  alignas(SHM_LINE) _Atomic uint64_t cma_go;
  alignas(SHM_LINE) _Atomic uint64_t cma_quit;
  /* Pieces this rank has spliced into the pipe to the other rank (two ranks, SHM_PIPE) */
  alignas(SHM_LINE) _Atomic uint64_t pushed;
  /* This rank's times of its last SHM_TOOK timed broadcasts and allgathers (SHM_TUNE_BROADCAST -
   * 1, SHM_TUNE_ALLGATHER - 1), call c at c % SHM_TOOK: the call's low 24 bits << 40 | ns */
  alignas(SHM_LINE) _Atomic uint64_t took[2][SHM_TOOK];
} shm_rank;

/* A timed broadcast or allgather, as rank 0 took it (shm_move_pick). */
typedef struct shm_past {
  unsigned cls; /* size class */
  int path;     /* 1: the staging buffers */
  size_t bytes;
} shm_past;

_Static_assert(sizeof(dt__fp) == 24, "the call board stores a fingerprint as three words");

/* One slot of the one-round ("flat") allreduce: rank r owns two (by round parity). The piece
 * starts right after the 32-byte header, so an allreduce of up to 32 bytes moves one cache line
 * per rank. g is the flat round the slot holds, 0 while it is being rewritten (so the call
 * board can read fp consistently, as a seqlock); g is stored last. */
typedef struct shm_flat {
  _Atomic uint64_t g;
  _Atomic uint64_t fp[3]; /* the dt__fp's 24 bytes, as words */
  uint8_t data[];
} shm_flat;
#define SHM_FLAT_HDR 32
/* Elements of a two-rank half-type flat piece widened ahead (shm_allreduce_flat): the first
 * 2048, so a whole piece of the 4 KiB that choose() sends flat at n = 2 (a larger
 * DTRAIN_SHM_FLAT piece reduces its rest from the halves). With the reduction of the widened
 * piece and the other's halves written out per type (reduce.c's ZMIX: f32 + f16 -> f16), bf16/f32
 * and f16/f32 in bytes/s, `bench/dtypes` medians of per-repetition ratios, 6 repetitions,
 * 2026-11-23: 512 elements (the previous setting) 0.88 at 2 KiB and 0.92-0.96 at 4 KiB; 2048
 * elements 1.14-1.16 and 1.09-1.21 with the host in a slow state; in a fast one (old and new
 * builds alternated) 2 KiB went from 0.86-0.89 to 1.15-1.18 and 4 KiB from 0.90-0.92 to 0.96, the
 * wait there being shorter than widening 2048 elements. Widening only until the other's piece is
 * there (256 at a time, polling its slot) was worse: 0.88-0.91 at 2-4 KiB. Before that kernel
 * (the generic mixed loop, type tests on every load) widening whole 4 KiB pieces had cost more
 * than it saved (0.65-0.82). */
#define SHM_FLAT_PRE 2048
_Static_assert(offsetof(shm_flat, data) == SHM_FLAT_HDR, "flat slot header is 32 bytes");

typedef struct shm_slot {
  dt__fp fp;
  uint64_t total, off;
  uint32_t len, type;
} shm_slot;
#define SHM_SLOT_HDR SHM_LINE

typedef struct shm_ring {
  alignas(SHM_LINE) _Atomic uint64_t head; /* pieces published (producer) */
  alignas(SHM_LINE) _Atomic uint64_t tail; /* pieces consumed (consumer) */
  alignas(SHM_LINE) uint8_t slots[];       /* nslots x (SHM_SLOT_HDR + slot_bytes) */
} shm_ring;

struct dt_transport {
  dt_comm *c;
  int n, rank;
  uint8_t *base;
  size_t size;
  shm_hdr *h;
  shm_rank *ranks;
  uint64_t chunks; /* allreduce chunks done on this communicator (same on every rank) */
  uint64_t flats;  /* flat rounds done, barriers' included (same on every rank) */
  bool broken;     /* a mismatch left rings in an unknown state */
  dt__fp cur;      /* last fingerprint published in this rank's cur_fp */
  int64_t spin_ns, yield_ns; /* waiting policy (see SHM_SPIN_NS) */
  bool oversubscribed; /* more ranks on this host than CPUs they may use together (host_cpus) */
  const void **srcs; /* [n]: the operands of one reduction, in the order they are reduced */
  float *wide;       /* [SHM_FLAT_PRE], two ranks only: a half-type flat piece widened ahead */
  uint8_t *win_base;  /* the shared window: rank r's part at win_base + r * win_stride */
  size_t win_size, win_stride;
  uint64_t wins;      /* window collectives done (same on every rank) */
  unsigned win_tries; /* dt_comm_window calls (same on every rank): names their store keys */
  size_t cma_min;     /* single-copy allreduce from this many bytes (0: never), as rank 0 set */
  size_t cma_move_min; /* single-copy allgather and broadcast from this many bytes (0: never) */
  size_t nt_min;      /* allreduce outputs streamed from this footprint (0: never), as rank 0 set */
  size_t cma_chunks;  /* chunks per step of the single-copy allreduce when not streaming, as rank 0 set */
  uint8_t *cma_buf;   /* single-copy allreduce: the other ranks' slices of one step */
  uint64_t cma_g;     /* the last single-copy call whose buffers this rank published */
  int pipe_in[2];     /* two ranks: this rank's incoming pipe (read end, write end), or -1 */
  int pipe_peer[2];   /* the other rank's incoming pipe, both ends (so it always has a reader) */
  size_t pipe_pages;  /* pages the smaller of the two pipes holds */
  size_t page;        /* the page size */
  bool piped;         /* the single-copy allreduce goes through the pipes (rank 0's verdict) */
  uint64_t pushes;    /* pieces spliced into the other rank's pipe (same count on both ranks) */
  size_t thp_step;    /* collapse buffers met twice onto huge pages, this much per call (0: never) */
  struct {
    uintptr_t at;
    size_t bytes;
    size_t done; /* bytes of its whole huge pages collapsed so far; SIZE_MAX: all and its ends, or a failure */
  } seen[SHM_THP_SEEN]; /* the last large buffers single copies met, round robin */
  unsigned seen_next;
  bool tune; /* the two-path collectives' path is chosen by measurement (SHM_TUNE_CLASSES) */
  uint64_t calls[SHM_TUNE_KINDS]; /* calls that could take either path, per collective (same on every rank) */
  dt__shm_tune tunes[SHM_TUNE_KINDS][SHM_TUNE_CLASSES]; /* rank 0: per collective and size class */
  shm_past past[2][SHM_TOOK]; /* rank 0: its last timed broadcasts and allgathers, as shm_rank.took */
};

static size_t shm_align(size_t v, size_t a) { return (v + a - 1) / a * a; }

static shm_ring *shm_ring_of(dt_transport *t, int from, int to) {
  return (shm_ring *)(t->base + t->h->off_rings + ((size_t)from * (size_t)t->n + (size_t)to) * t->h->ring_bytes);
}
static shm_slot *shm_slot_of(dt_transport *t, shm_ring *r, uint64_t i) {
  return (shm_slot *)(r->slots + (i % t->h->nslots) * (SHM_SLOT_HDR + t->h->slot_bytes));
}
static uint8_t *shm_stage(dt_transport *t, int rank, int buf) {
  return t->base + t->h->off_stage + ((size_t)rank * 2 + (size_t)buf) * t->h->chunk_bytes;
}
static shm_flat *shm_flat_of(dt_transport *t, int rank, int parity) {
  return (shm_flat *)(t->base + t->h->off_flat + ((size_t)rank * 2 + (size_t)parity) * t->h->flat_stride);
}


static _Atomic uint32_t *shm_bell(dt_transport *t, int r) { return r < 0 ? &t->h->bell : &t->ranks[r].bell; }
static _Atomic uint32_t *shm_sleepers(dt_transport *t, int r) {
  return r < 0 ? &t->h->sleepers : &t->ranks[r].sleepers;
}

/* Wakes the ranks asleep on this rank's bell and on the shared one (sendrecv's waiters, who may
 * wait for either of two peers, sleep there), after this rank published something. Only when
 * some sleep: a bell rung on every publication is a contended read-modify-write per message
 * (it cost the flat allreduce a cache-line round trip). The fence orders the publication
 * before the sleepers loads; shm_pause's waiter orders its sleepers increment before
 * re-reading the condition (Dekker), so either the waiter sees the publication or we see it. */
static void shm_ring_bell(dt_transport *t) {
  _Atomic uint32_t *mine = shm_sleepers(t, t->rank), *all = shm_sleepers(t, -1);
#ifdef __SANITIZE_THREAD__
  /* TSan models no fences: an RMW on sleepers pairs with the waiter's RMW the same way */
  uint32_t s_mine = atomic_fetch_add(mine, 0), s_all = atomic_fetch_add(all, 0);
#else
  atomic_thread_fence(memory_order_seq_cst);
  uint32_t s_mine = atomic_load_explicit(mine, memory_order_relaxed), s_all = atomic_load_explicit(all, memory_order_relaxed);
#endif
  for (int i = 0; i < 2; i++)
    if (i ? s_all : s_mine) {
      _Atomic uint32_t *b = shm_bell(t, i ? -1 : t->rank);
      atomic_fetch_add(b, 1);
      syscall(SYS_futex, b, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* ---- waiting ---- */

/* One wait of one caller. armed: the sleepers count this waiter added itself to; it must
 * re-check its condition once before sleeping (and shm_unarm when it stops waiting). */
typedef struct shm_wait {
  unsigned iter;
  int phase; /* 0 spin, 1 yield, 2 sleep */
  _Atomic uint32_t *armed;
  int64_t t0, next_alive;
  int gone; /* 1 + the rank found gone, whom the caller looks at once more before it is reported */
  bool aborted; /* the job's abort was seen; the caller has looked once more since */
} shm_wait;

/* Ends one wait (the condition held, or the caller gives up), so the next starts spinning. */
static void shm_unarm(dt_transport *t, shm_wait *w) {
  (void)t;
  if (w->armed)
    atomic_fetch_sub(w->armed, 1);
  *w = (shm_wait){.next_alive = w->next_alive};
}

static dt_status shm_dead(dt_transport *t, int peer, int pid) {
  char pn[64];
  dt__comm_peer_name(t->c, peer, pn, sizeof pn);
  if (atomic_load(&t->ranks[peer].left))
    return dt_set_error(DT_ERR_PEER, "%s (pid %d) left: it destroyed its communicator without joining this call",
                        pn, pid);
  return dt_set_error(DT_ERR_PEER, "%s (pid %d) exited or was killed", pn, pid);
}

/* Checks that a rank's process still exists (kill(pid, 0); a zombie counts as gone) and has not
 * destroyed its communicator (a process that fails for its own reasons, a full disk say, and
 * destroys it lives on; the rank hosting the store even waits there for the others to leave). */
static bool shm_alive(dt_transport *t, int peer, int *pid_out) {
  int pid = atomic_load_explicit(&t->ranks[peer].pid, memory_order_relaxed);
  *pid_out = pid;
  if (atomic_load(&t->ranks[peer].left))
    return false;
  if (pid <= 0)
    return true;
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return false;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return true;
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[k] = '\0';
  const char *p = strrchr(buf, ')');
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

/* Publishes the collective call this rank is in (point-to-point calls are not collective and
 * are not published). */
static void shm_board_set(dt_transport *t, const dt__fp *fp) {
  if (fp->coll == DT_COLL_SEND || dt__fp_equal(&t->cur, fp))
    return;
  shm_rank *me = &t->ranks[t->rank];
  uint64_t w[3];
  memcpy(w, fp, sizeof w);
  uint32_t v = atomic_load(&me->cur_ver);
  atomic_store(&me->cur_ver, v + 1);
  for (int i = 0; i < 3; i++)
    atomic_store(&me->cur_fp[i], w[i]);
  atomic_store(&me->cur_ver, v + 2);
  t->cur = *fp;
}

/* DT_ERR_MISMATCH if `peer` is in a different collective call at our place (dt__fp_same_place). */
static dt_status shm_board_check(dt_transport *t, int peer, const dt__fp *fp) {
  if (peer < 0 || fp->coll == DT_COLL_SEND)
    return DT_OK;
  shm_rank *pr = &t->ranks[peer];
  for (int tries = 0; tries < 4; tries++) {
    uint32_t v1 = atomic_load(&pr->cur_ver);
    if (v1 & 1)
      continue;
    uint64_t w[3];
    for (int i = 0; i < 3; i++)
      w[i] = atomic_load(&pr->cur_fp[i]);
    if (atomic_load(&pr->cur_ver) != v1)
      continue;
    dt__fp theirs;
    memcpy(&theirs, w, sizeof theirs);
    if (v1 && dt__fp_same_place(&theirs, fp) && !dt__fp_equal(&theirs, fp)) {
      t->broken = true;
      return dt__comm_mismatch(t->c, peer, &theirs, fp);
    }
    break;
  }
  /* The flat allreduce does not write the board: its slots carry the fingerprint instead. */
  for (int p = 0; p < 2; p++) {
    shm_flat *s = shm_flat_of(t, peer, p);
    /* seqlock read: acquire loads keep the second read of g after the words */
    uint64_t g1 = atomic_load_explicit(&s->g, memory_order_acquire), w[3];
    for (int i = 0; i < 3; i++)
      w[i] = atomic_load_explicit(&s->fp[i], memory_order_acquire);
    if (!g1 || atomic_load_explicit(&s->g, memory_order_relaxed) != g1)
      continue;
    dt__fp theirs;
    memcpy(&theirs, w, sizeof theirs);
    if (dt__fp_same_place(&theirs, fp) && !dt__fp_equal(&theirs, fp)) {
      t->broken = true;
      return dt__comm_mismatch(t->c, peer, &theirs, fp);
    }
  }
  return DT_OK;
}

/* Whether `peer` is in (or past) a collective call this rank has not started, by its board or
 * its flat slots: a point-to-point call waiting for it then waits for a rank that waits for us.
 * *theirs: that call. The caller looks at its rings once more before it believes it: a peer
 * publishes its sends before it enters the next collective. */
static bool shm_board_ahead(dt_transport *t, int peer, dt__fp *theirs) {
  uint64_t mine = t->c->seq; /* collectives started here; none is in flight during a p2p call */
  shm_rank *pr = &t->ranks[peer];
  uint32_t v1 = atomic_load(&pr->cur_ver);
  uint64_t w[3];
  for (int i = 0; i < 3; i++)
    w[i] = atomic_load(&pr->cur_fp[i]);
  memcpy(theirs, w, sizeof *theirs);
  if (v1 && !(v1 & 1) && atomic_load(&pr->cur_ver) == v1 && theirs->seq > mine)
    return true;
  for (int p = 0; p < 2; p++) {
    shm_flat *s = shm_flat_of(t, peer, p);
    uint64_t g1 = atomic_load_explicit(&s->g, memory_order_acquire);
    for (int i = 0; i < 3; i++)
      w[i] = atomic_load_explicit(&s->fp[i], memory_order_acquire);
    memcpy(theirs, w, sizeof *theirs);
    if (g1 && atomic_load(&s->g) == g1 && theirs->seq > mine)
      return true;
  }
  return false;
}

/* One step of waiting for `peer` (the rank whose progress we need; -1 = several, all checked
 * for liveness). bell is the bell value read before the condition was found false. */
/* bell_rank: whose bell the caller read (`bell`) before finding its condition false: the
 * awaited rank's, or -1 for the shared one. */
static dt_status shm_pause(dt_transport *t, shm_wait *w, int bell_rank, uint32_t bell, int peer, const dt__fp *fp,
                           int64_t deadline) {
  dt_comm *c = t->c;
  if (w->aborted) /* it looked once more after the abort (below) and still waits */
    return dt__comm_abort_status(c);
  w->iter++;
  int64_t spin_ns = t->spin_ns, yield_ns = t->yield_ns;
  if (dt__on_progress_thread()) {
    spin_ns = DT_MIN(spin_ns, SHM_SPIN_BG_NS);
    yield_ns = 0;
  }
  if (w->iter == 1 && !spin_ns) { /* no spinning: yield from the first pause */
    w->t0 = dt_now_ns();
    w->phase = 1;
  }
  if (w->phase == 0) {
    /* 16 pauses between looks at the clock: the checks below cost ~100 ns */
    dt__cpu_relax();
    if (w->iter & 15)
      return DT_OK;
    int64_t now = dt_now_ns();
    if (!w->t0)
      w->t0 = now;
    else if (now - w->t0 >= spin_ns)
      w->phase = 1;
  } else if (w->phase == 1) {
    sched_yield();
    if (dt_now_ns() - w->t0 >= spin_ns + yield_ns)
      w->phase = 2;
  } else if (!w->armed) {
    /* Count ourselves as a sleeper, then let the caller re-read the bell and its condition
     * once more before the futex wait: a publisher that missed us in sleepers is seen there. */
    w->armed = shm_sleepers(t, bell_rank);
    atomic_fetch_add(w->armed, 1);
#ifndef __SANITIZE_THREAD__
    atomic_thread_fence(memory_order_seq_cst); /* pairs with shm_ring_bell's */
#endif
    return DT_OK;
  } else {
    struct timespec ts = {0, SHM_SLEEP_NS};
    syscall(SYS_futex, shm_bell(t, bell_rank), FUTEX_WAIT, bell, &ts, NULL, 0);
  }
  /* The job failed (the others' next call, maybe): the caller looks once more first, as for a
   * rank found gone, since what it waits for may have come during this pause (the last rank
   * published, the others left this call and aborted the next before this rank looked); a call
   * whose every part arrived completes, and the rank fails in its next one. */
  if (dt__comm_aborted(c)) {
    w->aborted = true;
    return DT_OK;
  }
  if (w->iter >= 64 || w->phase)
    DT_CHECK(shm_board_check(t, peer, fp));
  int64_t now = dt_now_ns();
  if (now >= deadline) {
    char pn[64];
    dt__comm_peer_name(c, peer, pn, sizeof pn);
    return dt_set_error(DT_ERR_TIMEOUT, "deadline (%d ms) passed waiting for %s", c->timeout_ms, pn);
  }
  if (now >= w->next_alive) {
    if (w->next_alive) {
      int pid = 0;
      for (int r = 0; r < t->n; r++)
        if (r != t->rank && (peer < 0 || r == peer) && !shm_alive(t, r, &pid)) {
          /* A rank exits as soon as its part of the call is published, maybe after the caller
           * last looked (a waiter descheduled between its look and this check saw a finished
           * barrier's last rank "killed"). The caller looks once more: gone still, and what it
           * waits for not there, means it never will be. */
          if (w->gone == r + 1)
            return shm_dead(t, r, pid);
          w->gone = r + 1;
          return DT_OK;
        }
    }
    w->next_alive = now + SHM_ALIVE_NS;
  }
  return DT_OK;
}

/* Whether a collective may start: DT_ERR_STATE after an earlier mismatch left the slots, rings
 * and counters in an unknown state, the job's verdict once it was aborted. */
static dt_status shm_usable(dt_transport *t) {
  if (t->broken)
    return dt_set_error(DT_ERR_STATE, "rank %d: shared-memory transport unusable after an earlier mismatch", t->rank);
  if (dt__comm_aborted(t->c))
    return dt__comm_abort_status(t->c);
  return DT_OK;
}

/* ---- setup ---- */

/* ---- pipes (two ranks; SHM_PIPE) ---- */

static void shm_pipe_close(dt_transport *t) {
  for (int i = 0; i < 2; i++) {
    if (t->pipe_in[i] >= 0)
      close(t->pipe_in[i]);
    if (t->pipe_peer[i] >= 0)
      close(t->pipe_peer[i]);
    t->pipe_in[i] = t->pipe_peer[i] = -1;
  }
  t->piped = false;
}

/* This rank's incoming pipe, as large as an unprivileged process may make one (1 MiB unless
 * /proc/sys/fs/pipe-max-size says otherwise; the default 64 KiB if that fails): a call goes
 * through the pipes only if the other rank's half fits in it (shm_pipe_fits). */
static bool shm_pipe_open(dt_transport *t) {
  if (pipe2(t->pipe_in, O_CLOEXEC | O_NONBLOCK) != 0) {
    t->pipe_in[0] = t->pipe_in[1] = -1;
    return false;
  }
  long most = 1L << 20;
  FILE *f = fopen("/proc/sys/fs/pipe-max-size", "r");
  if (f) {
    if (fscanf(f, "%ld", &most) != 1 || most <= 0)
      most = 1L << 20;
    fclose(f);
  }
  (void)fcntl(t->pipe_in[1], F_SETPIPE_SZ, (int)DT_MIN(most, 1L << 20));
  /* vmsplice itself may be refused (a seccomp filter): find out here, not in a collective */
  uint64_t probe = SHM_MAGIC, back = 0;
  struct iovec v = {&probe, sizeof probe};
  if (vmsplice(t->pipe_in[1], &v, 1, SPLICE_F_NONBLOCK) == (ssize_t)sizeof probe &&
      read(t->pipe_in[0], &back, sizeof back) == (ssize_t)sizeof back && back == SHM_MAGIC)
    return true;
  DT_LOG_INFO("shared memory: the allreduce copies with process_vm_readv/writev: vmsplice into a pipe: %s",
              strerror(errno));
  shm_pipe_close(t);
  return false;
}

static int shm_pidfd_getfd(int pid, int fd) {
  int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pfd < 0)
    return -1;
  int got = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
  int e = errno;
  close(pfd);
  errno = e;
  return got;
}

/* Takes both ends of rank r's (process pid) incoming pipe, descriptors rfd and wfd there. */
static bool shm_pipe_take(dt_transport *t, int r, int pid, int rfd, int wfd) {
  if (pid <= 0 || rfd < 0 || wfd < 0)
    return false;
  struct stat a, b;
  t->pipe_peer[0] = shm_pidfd_getfd(pid, rfd);
  t->pipe_peer[1] = t->pipe_peer[0] >= 0 ? shm_pidfd_getfd(pid, wfd) : -1;
  if (t->pipe_peer[1] >= 0 && fstat(t->pipe_peer[0], &a) == 0 && fstat(t->pipe_peer[1], &b) == 0 &&
      S_ISFIFO(a.st_mode) && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
    return true;
  DT_LOG_INFO("shared memory: the allreduce copies with process_vm_readv/writev: taking rank %d's pipe (pid %d): %s",
              r, pid, t->pipe_peer[1] >= 0 ? "not one pipe" : strerror(errno));
  shm_pipe_close(t);
  return false;
}

static void shm_destroy(dt_transport *t) {
  if (!t)
    return;
  /* What peers sent us that nothing received is lost with the segment: say so (a send whose
   * recv never came). Not after a failure, which leaves pieces of the failed call behind. */
  for (int r = 0; t->base && t->ranks && r < t->n && !t->broken && !dt__comm_aborted(t->c); r++) {
    if (r == t->rank)
      continue;
    shm_ring *ring = shm_ring_of(t, r, t->rank);
    uint64_t left = atomic_load(&ring->head) - atomic_load(&ring->tail);
    if (left)
      DT_LOG_WARN("rank %d: %llu piece(s) of what rank %d sent were never received and are lost (a dt_comm_send "
                  "without its dt_comm_recv?)", t->rank, (unsigned long long)left, r);
  }
  if (t->base && t->ranks) {
    atomic_store(&t->ranks[t->rank].left, 1);
    shm_ring_bell(t); /* a rank asleep waiting for us looks again */
  }
  if (t->base)
    munmap(t->base, t->size);
  if (t->win_base)
    munmap(t->win_base, t->win_size);
  shm_pipe_close(t);
  dt__free(t->srcs);
  dt__free(t->wide);
  dt__free(t->cma_buf);
  dt__free(t);
}

static void shm_name(const dt_comm *c, const char *nonce, char *out, size_t n) {
  char job[64], pre[64];
  snprintf(job, sizeof job, "%s", c->env.job_id[0] ? c->env.job_id : "job");
  snprintf(pre, sizeof pre, "%s", c->prefix);
  for (char *p = job; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
      *p = '_';
  for (char *p = pre; *p; p++)
    if (*p == '/')
      *p = '.';
  snprintf(out, n, "/dtrain-%s-%s%s-p%d", job, pre, nonce, (int)getpid());
}

/* A creator killed between creating a segment and unlinking it (everyone mapped) leaves its
 * name behind. Names end in "-p<creator pid>": remove those whose creator no longer exists.
 * Best effort, never fails the caller. */
static void shm_sweep(void) {
  DIR *d = opendir("/dev/shm");
  if (!d)
    return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, "dtrain-", 7) != 0)
      continue;
    const char *p = strrchr(e->d_name, '-');
    char *end;
    if (!p || p[1] != 'p')
      continue;
    long pid = strtol(p + 2, &end, 10);
    if (*end || pid <= 0 || pid > INT_MAX)
      continue;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
      char path[300];
      snprintf(path, sizeof path, "/%s", e->d_name);
      if (shm_unlink(path) == 0)
        DT_LOG_INFO("removed shared memory %s left by process %ld, which no longer exists", path, pid);
    }
  }
  closedir(d);
}

static dt_status shm_env_size(const char *name, uint64_t def, uint64_t lo, uint64_t hi, uint64_t *out) {
  DT_CHECK(dt__env_size(name, def, out));
  if (*out < lo || *out > hi)
    return dt_set_error(DT_ERR_INVALID, "%s=%llu is outside %llu..%llu", name, (unsigned long long)*out,
                        (unsigned long long)lo, (unsigned long long)hi);
  *out = *out / SHM_LINE * SHM_LINE;
  return DT_OK;
}

/* Creates shared memory `name` of `size` bytes, all of it backed now (so that a full /dev/shm
 * fails here, not as a SIGBUS later), and maps it. On failure nothing is left behind. */
static dt_status shm_alloc(const char *name, size_t size, void **out) {
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return dt__errno(DT_ERR_SYSTEM, "shm_open(%s)", name);
  int e = ftruncate(fd, (off_t)size) != 0 ? errno : posix_fallocate(fd, 0, (off_t)size);
  if (e) {
    close(fd);
    shm_unlink(name);
    errno = e;
    return dt__errno(DT_ERR_SYSTEM, "sizing shared memory %s to %zu bytes (%s)", name, size,
                     e == EFBIG ? "a file-size limit, ulimit -f?" : "is /dev/shm large enough?");
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name);
    return dt__errno(DT_ERR_SYSTEM, "mmap of %zu bytes of shared memory", size);
  }
  *out = p;
  return DT_OK;
}

/* Rank 0: creates, sizes and initializes the segment. */
static dt_status shm_make(dt_transport *t, const char *name) {
  uint64_t slot, nslots, chunk;
  DT_CHECK(shm_env_size("DTRAIN_SHM_SLOT", SHM_DEFAULT_SLOT, 4096, 64u << 20, &slot));
  DT_CHECK(dt__env_size("DTRAIN_SHM_SLOTS", SHM_DEFAULT_NSLOTS, &nslots));
  if (nslots < 2 || nslots > 64)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_SLOTS=%llu is outside 2..64", (unsigned long long)nslots);
  DT_CHECK(shm_env_size("DTRAIN_SHM_CHUNK", SHM_DEFAULT_CHUNK, 4096, 256u << 20, &chunk));
  uint64_t flat;
  DT_CHECK(shm_env_size("DTRAIN_SHM_FLAT", SHM_DEFAULT_FLAT, 64, 16u << 20, &flat));
  const char *ce = dt__env_str("DTRAIN_SHM_CMA");
  uint64_t cma = 0, cma_move = 0; /* stay 0 ("never") for off */
  if (!(ce && !strcmp(ce, "off"))) {
    DT_CHECK(dt__env_size("DTRAIN_SHM_CMA", SHM_DEFAULT_CMA, &cma));
    if (cma == 0)
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_CMA=0: give a size in bytes (from which collectives copy once) "
                          "or off");
    cma_move = ce ? cma : SHM_DEFAULT_CMA_MOVE;
    if (!ce && t->oversubscribed)
      cma = cma_move = SHM_OVER_CMA;
  }
  const char *pe = dt__env_str("DTRAIN_SHM_PIPE");
  if (pe && strcmp(pe, "on") && strcmp(pe, "off"))
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_PIPE=%s: on or off", pe);
  const char *ne = dt__env_str("DTRAIN_SHM_NT");
  uint64_t nt = 0; /* stays 0 ("never") for off */
  if (!(ne && !strcmp(ne, "off"))) {
    DT_CHECK(dt__env_size("DTRAIN_SHM_NT", dt__cpu_amd() ? 0 : SHM_DEFAULT_NT, &nt));
    if (ne && nt == 0)
      return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_NT=0: give a size in bytes (the allreduce footprint from "
                          "which outputs bypass the caches) or off");
  }
  size_t n = (size_t)t->n;
  /* Rings grow with n^2: past SHM_RINGS_MAX in all, smaller slots (a 16 KiB floor) keep the
   * segment within bounds for many ranks unless DTRAIN_SHM_SLOT asks otherwise. */
  if (!dt__env_str("DTRAIN_SHM_SLOT") && n * n * nslots * slot > SHM_RINGS_MAX)
    slot = DT_MAX((uint64_t)16 << 10, SHM_RINGS_MAX / (n * n * nslots) / 4096 * 4096);
  size_t off_ranks = shm_align(sizeof(shm_hdr), 4096);
  size_t off_rings = shm_align(off_ranks + n * sizeof(shm_rank), 4096);
  size_t ring_bytes = shm_align(sizeof(shm_ring) + nslots * (SHM_SLOT_HDR + slot), 4096);
  size_t off_stage = shm_align(off_rings + n * n * ring_bytes, 4096);
  size_t flat_stride = shm_align(SHM_FLAT_HDR + flat, SHM_LINE);
  size_t off_flat = shm_align(off_stage + n * 2 * chunk, 4096);
  size_t size = off_flat + n * 2 * flat_stride;
  void *p;
  DT_CHECK(shm_alloc(name, size, &p));
  t->base = p;
  t->size = size;
  t->h = p;
  *t->h = (shm_hdr){.magic = SHM_MAGIC, .size = size, .n = (uint32_t)n, .nslots = (uint32_t)nslots,
                    .slot_bytes = slot, .chunk_bytes = chunk, .off_ranks = off_ranks, .off_rings = off_rings,
                    .off_stage = off_stage, .ring_bytes = ring_bytes, .off_flat = off_flat,
                    .flat_bytes = flat, .flat_stride = flat_stride, .cma_min = cma,
                    .cma_move_min = cma_move, .nt_min = nt,
                    .cma_chunks = dt__cpu_zen5() ? SHM_ZEN5_CHUNKS : 1,
                    .owner_addr = (uint64_t)(uintptr_t)p, .owner_pid = (int32_t)getpid(),
                    .owner_pipe = {-1, -1}};
  atomic_store(&t->h->cma, cma ? 0u : 2u);
  /* the others take this pipe once they mapped the segment */
  bool pipes = pe ? !strcmp(pe, "on") : dt__cpu_zen4();
  if (n == 2 && cma && !t->oversubscribed && pipes && shm_pipe_open(t)) {
    t->h->owner_pipe[0] = t->pipe_in[0];
    t->h->owner_pipe[1] = t->pipe_in[1];
  }
  return DT_OK;
}

/* Maps shared memory `name` that another rank created: all of it (*size), which must be at
 * least `least` bytes. On failure nothing stays mapped. */
static dt_status shm_attach(const char *name, size_t least, void **out, size_t *size) {
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return dt__errno(DT_ERR_SYSTEM, "shm_open(%s) (are all ranks on one host? DTRAIN_TRANSPORT=tcp otherwise)", name);
  struct stat sb;
  if (fstat(fd, &sb) != 0 || sb.st_size < (off_t)least) {
    close(fd);
    return dt_set_error(DT_ERR_PROTOCOL, "shared memory %s is smaller than %zu bytes", name, least);
  }
  *size = (size_t)sb.st_size;
  void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return dt__errno(DT_ERR_SYSTEM, "mmap of %zu bytes of shared memory", *size);
  *out = p;
  return DT_OK;
}

/* Other ranks: map the segment rank 0 made and check it is what we expect. */
static dt_status shm_map(dt_transport *t, const char *name) {
  void *p;
  size_t size;
  DT_CHECK(shm_attach(name, sizeof(shm_hdr), &p, &size));
  t->base = p;
  t->size = size;
  t->h = p;
  if (t->h->magic != SHM_MAGIC || t->h->size != size || t->h->n != (uint32_t)t->n)
    return dt_set_error(DT_ERR_PROTOCOL, "shared memory %s does not belong to this communicator", name);
  return DT_OK;
}

/* Whether this process may read another's memory (process_vm_readv/writev need ptrace access:
 * the same user, and neither Yama's ptrace_scope, a seccomp filter nor the target's
 * PR_SET_DUMPABLE = 0 in the way): reads the segment's header at `addr` in process `pid` (where
 * that process maps it) and compares the magic. Every rank probes rank 0 and rank 0 probes every
 * rank; rank 0 decides for all. */
static bool shm_cma_probe(int r, int pid, uint64_t addr) {
  uint64_t magic = 0;
  struct iovec l = {&magic, sizeof magic}, rv = {(void *)(uintptr_t)addr, sizeof magic};
  if (pid > 0 && addr && process_vm_readv(pid, &l, 1, &rv, 1, 0) == (ssize_t)sizeof magic && magic == SHM_MAGIC)
    return true;
  DT_LOG_INFO("shared memory: collectives copy through staging buffers: reading rank %d's memory (pid %d): %s", r, pid,
              magic ? "unexpected contents" : strerror(errno));
  return false;
}

/* Rank 0: rank r's answer in its shm/mapped key, "<pid> <header address> <1 if it could read
 * rank 0's memory> <1 if it took rank 0's pipe> <its pipe's read end> <write end>", and whether
 * rank 0 can read rank r's memory; with a pipe of its own (two ranks), takes rank r's too
 * (shm_pipe_take) or gives up both. */
static bool shm_cma_answer(dt_transport *t, int r, const char *val) {
  int pid = 0, ok = 0, pok = 0, rfd = -1, wfd = -1;
  unsigned long long addr = 0;
  if (sscanf(val, "%d %llx %d %d %d %d", &pid, &addr, &ok, &pok, &rfd, &wfd) != 6)
    return false;
  if (!ok)
    DT_LOG_INFO("shared memory: collectives copy through staging buffers: rank %d may not read rank 0's memory", r);
  if (!ok || !shm_cma_probe(r, pid, addr))
    return false;
  if (t->pipe_in[1] >= 0 && !(pok && shm_pipe_take(t, r, pid, rfd, wfd)))
    shm_pipe_close(t);
  return true;
}

/* Rank 0: whether single copies are fast here. process_vm_readv pins the pages it copies one by
 * one; on this project's Xeon guest it moves about 12 GB/s for a quarter megabyte in cache, but an
 * earlier AMD EPYC guest moved only 0.6 GB/s this way (against 4 GB/s for memcpy), where the
 * staged paths' two copies win. So rank 0 times three such reads of a buffer of its own (the same
 * pinning as from another process, without first faulting in pages nobody touched) and keeps
 * single copies from SHM_CMA_MIN_GBS for the best (not when DTRAIN_SHM_CMA asks for them). The
 * rate and the time the probe took are logged at debug level. */
#define SHM_CMA_MIN_GBS 2.0
#define SHM_CMA_PROBE_BYTES (256u << 10)
static bool shm_cma_fast(void) {
  uint8_t *buf = dt__alloc(2 * SHM_CMA_PROBE_BYTES);
  if (!buf)
    return false;
  memset(buf, 1, 2 * SHM_CMA_PROBE_BYTES);
  int64_t best = INT64_MAX, t_all = dt_now_ns();
  for (int i = 0; i < 3; i++) {
    struct iovec l = {buf + SHM_CMA_PROBE_BYTES, SHM_CMA_PROBE_BYTES}, rv = {buf, SHM_CMA_PROBE_BYTES};
    int64_t t0 = dt_now_ns();
    if (process_vm_readv(getpid(), &l, 1, &rv, 1, 0) != (ssize_t)SHM_CMA_PROBE_BYTES) {
      best = INT64_MAX;
      break;
    }
    best = DT_MIN(best, dt_now_ns() - t0);
  }
  dt__free(buf);
  double gbs = best == INT64_MAX ? 0 : (double)SHM_CMA_PROBE_BYTES / (double)DT_MAX(best, 1);
  DT_LOG_DEBUG("shared memory: process_vm_readv moves %.2f GB/s here (%u bytes; the probe took %.0f us)", gbs,
               SHM_CMA_PROBE_BYTES, (double)(dt_now_ns() - t_all) / 1e3);
  if (gbs < SHM_CMA_MIN_GBS)
    DT_LOG_INFO("shared memory: collectives copy through staging buffers: process_vm_readv moves %.2f GB/s here "
                "(single copies need %.1f)", gbs, SHM_CMA_MIN_GBS);
  return gbs >= SHM_CMA_MIN_GBS;
}

/* Other ranks: waits for rank 0's verdict on single-copy collectives (it is the same for all). */
static dt_status shm_cma_verdict(dt_transport *t, int64_t deadline) {
  while (!atomic_load(&t->h->cma)) {
    int pid;
    if (dt_now_ns() >= deadline)
      return dt_set_error(DT_ERR_TIMEOUT, "deadline (%d ms) passed waiting for rank 0 to set up the shared memory",
                          t->c->timeout_ms);
    if (!shm_alive(t, 0, &pid))
      return shm_dead(t, 0, pid);
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return DT_OK;
}

/* DTRAIN_SHM_THP: on (the default), off, or the most bytes one call collapses (on: SHM_THP_STEP);
 * *step 0 is off, as where the host's transparent huge pages are "never" (MADV_COLLAPSE would
 * ignore that setting; we do not). */
static dt_status shm_thp_setting(size_t *step) {
  const char *e = dt__env_str("DTRAIN_SHM_THP");
  uint64_t v = SHM_THP_STEP;
  if (e && !strcmp(e, "off"))
    v = 0;
  else if (e && strcmp(e, "on") && (dt__env_size("DTRAIN_SHM_THP", SHM_THP_STEP, &v) != DT_OK || v < (2u << 20)))
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_THP=%s: on, off, or the bytes one call may collapse onto huge "
                        "pages, at least 2M", e);
  *step = dt__thp_enabled() == 0 ? 0 : (size_t)v;
  return DT_OK;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14; older kernels refuse it, and the reads fault instead */
#endif

/* Makes the page-table entries of [p, p + len) in one call, then reads one byte of every page
 * (atomic loads, which the compiler keeps); returns len. */
static size_t shm_touch(const void *p, size_t len) {
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)4095;
  (void)madvise((void *)a, len + ((uintptr_t)p - a), MADV_POPULATE_READ);
  for (size_t o = 0; o < len; o += 4096)
    (void)atomic_load_explicit((const _Atomic uint8_t *)p + o, memory_order_relaxed);
  return len;
}

/* Reads the pages of the segment this rank's collectives use, so that a job's first calls run as
 * fast as its later ones: every rank's staging buffers and flat slots and, with two ranks (whose
 * allreduce takes rd through the rings up to 128 KiB), the rings to and from the other rank. On
 * the Firecracker guest of 2026-12-04 (Zen 5) a process's first access to a page of the segment
 * cost 5-11 us, and still about 5 with its page-table entry made ahead (MAP_POPULATE,
 * MADV_POPULATE_READ or _WRITE); a second access, read or write, cost nothing. A job's first four
 * rd allreduces of 64 KiB (a ring slot of 16 pages each, four slots) took 320-790 us against 6
 * later, the fast path's 10th call (its first through the staging buffers) 350-410, and the
 * timed choice (collectives.c) read rd at 157-330 us in its first trial, so it took the slower
 * path until its second (bench/results/first-touch-2026-12-04-zen5.txt). Here that cost moves to
 * setup: 6-7 ms for two ranks there, 12-13 for eight. Every rank reads before it tells rank 0 it
 * mapped the segment, and no rank writes these parts before rank 0 heard from all: the reads race
 * with no write. */
static void shm_prefault(dt_transport *t) {
  const size_t n = (size_t)t->n;
  const int64_t t0 = dt_now_ns();
  size_t bytes = shm_touch(shm_stage(t, 0, 0), n * 2 * t->h->chunk_bytes) +
                 shm_touch(shm_flat_of(t, 0, 0), n * 2 * t->h->flat_stride);
  if (n == 2)
    bytes += shm_touch(shm_ring_of(t, 0, 1), t->h->ring_bytes) + shm_touch(shm_ring_of(t, 1, 0), t->h->ring_bytes);
  DT_LOG_DEBUG("shared memory: rank %d read %zu KiB of the segment ahead in %.1f ms", t->rank, bytes >> 10,
               (double)(dt_now_ns() - t0) / 1e6);
}

static dt_status shm_create(dt_comm *c, dt_transport **out) {
  *out = NULL;
  dt_transport *t = dt__calloc(sizeof *t);
  if (!t)
    return DT_ERR_NOMEM;
  t->c = c;
  t->n = c->size;
  t->rank = c->rank;
  t->pipe_in[0] = t->pipe_in[1] = t->pipe_peer[0] = t->pipe_peer[1] = -1;
  t->srcs = dt__calloc((size_t)t->n * sizeof *t->srcs);
  t->wide = t->n == 2 ? dt__alloc(SHM_FLAT_PRE * sizeof *t->wide) : NULL;
  if (!t->srcs || (t->n == 2 && !t->wide)) {
    dt__free(t->srcs);
    dt__free(t->wide);
    dt__free(t);
    return DT_ERR_NOMEM;
  }
  /* Oversubscribed: more ranks of the job on this host than CPUs they may run on together. */
  int ncpu = c->host_cpus > 0 ? c->host_cpus : dt__comm_cpus();
  int on_host = DT_MAX(DT_MAX(c->size, c->local_size), c->env.local_size);
  t->oversubscribed = ncpu > 0 && on_host > ncpu;
  int64_t spin_us, yield_us; /* up to 10 s each */
  if (dt__env_int_range("DTRAIN_SHM_SPIN_US", (t->oversubscribed ? SHM_SPIN_OVER_NS : SHM_SPIN_NS) / 1000, 0, 10000000,
                        &spin_us) != DT_OK ||
      dt__env_int_range("DTRAIN_SHM_YIELD_US", (t->oversubscribed ? SHM_YIELD_OVER_NS : SHM_YIELD_NS) / 1000, 0,
                        10000000, &yield_us) != DT_OK) {
    shm_destroy(t);
    return DT_ERR_INVALID;
  }
  t->spin_ns = spin_us * 1000;
  t->yield_ns = yield_us * 1000;
  if (shm_thp_setting(&t->thp_step) != DT_OK) {
    shm_destroy(t);
    return DT_ERR_INVALID;
  }
  if (t->n == 1) {
    *out = t;
    return DT_OK;
  }
  int64_t deadline = dt__comm_deadline(c);
  char name[200], key[128];
  size_t len = 0;
  dt_status st;
  bool owner = t->rank == 0;
  dt__comm_key(c, key, sizeof key, "shm/name");
  if (owner) {
    uint8_t r[6];
    char nonce[16];
    DT_CHECK_GOTO(dt__random_bytes(r, sizeof r), st, fail);
    snprintf(nonce, sizeof nonce, "%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5]);
    shm_sweep();
    shm_name(c, nonce, name, sizeof name);
    DT_CHECK_GOTO(shm_make(t, name), st, fail);
    shm_prefault(t);
    DT_CHECK_GOTO(dt__store_set(c->store, key, name, strlen(name), deadline), st, fail_unlink);
  } else {
    st = dt__store_wait(c->store, key, name, sizeof name - 1, &len, deadline);
    if (st != DT_OK) {
      dt__error_prefix(st, "waiting for rank 0 to create the shared memory");
      goto fail;
    }
    name[len] = '\0';
    DT_CHECK_GOTO(shm_map(t, name), st, fail);
    shm_prefault(t);
  }
  t->ranks = (shm_rank *)(t->base + t->h->off_ranks);
  atomic_store(&t->ranks[t->rank].pid, (int32_t)getpid());
  if (owner) {
    /* Unlink once everybody mapped: from then on the segment lives exactly as long as the last
     * mapping, whatever happens to the processes. */
    bool cma = t->h->cma_min != 0; /* from SHM_OVER_CMA with more ranks than CPUs (shm_make) */
    for (int r = 1; r < t->n; r++) {
      char k2[128], v[64];
      dt__comm_key(c, k2, sizeof k2, "shm/mapped/%d", r);
      st = dt__store_wait(c->store, k2, v, sizeof v - 1, &len, deadline);
      if (st != DT_OK) {
        dt__error_prefix(st, "waiting for rank %d to map the shared memory", r);
        goto fail_unlink;
      }
      v[len] = '\0';
      cma = cma && shm_cma_answer(t, r, v);
    }
    if (cma && !dt__env_str("DTRAIN_SHM_CMA")) /* asked for: used whatever the rate */
      cma = shm_cma_fast();
    shm_unlink(name);
    atomic_store(&t->h->pipe, cma && t->pipe_peer[1] >= 0 ? 1u : 2u);
    atomic_store(&t->h->tune, cma && !dt__env_str("DTRAIN_SHM_CMA") ? 1u : 2u);
    atomic_store(&t->h->cma, cma ? 1u : 2u);
  } else {
    char k2[128], v[64];
    dt__comm_key(c, k2, sizeof k2, "shm/mapped/%d", t->rank);
    bool ok = t->h->cma_min && shm_cma_probe(0, t->h->owner_pid, t->h->owner_addr);
    bool pok = ok && t->h->owner_pipe[1] >= 0 && !t->oversubscribed && shm_pipe_open(t) &&
               shm_pipe_take(t, 0, t->h->owner_pid, t->h->owner_pipe[0], t->h->owner_pipe[1]);
    snprintf(v, sizeof v, "%d %llx %d %d %d %d", (int)getpid(), (unsigned long long)(uintptr_t)t->h, ok, pok,
             pok ? t->pipe_in[0] : -1, pok ? t->pipe_in[1] : -1);
    DT_CHECK_GOTO(dt__store_set(c->store, k2, v, strlen(v), deadline), st, fail);
    DT_CHECK_GOTO(shm_cma_verdict(t, deadline), st, fail);
  }
  t->cma_min = atomic_load(&t->h->cma) == 1 ? t->h->cma_min : 0;
  t->tune = t->cma_min && atomic_load(&t->h->tune) == 1;
  t->cma_move_min = t->cma_min ? t->h->cma_move_min : 0;
  t->nt_min = t->h->nt_min;
  t->cma_chunks = (size_t)t->h->cma_chunks;
  t->piped = t->cma_min && atomic_load(&t->h->pipe) == 1 && t->pipe_peer[1] >= 0;
  if (!t->piped) {
    shm_pipe_close(t);
  } else {
    t->page = (size_t)sysconf(_SC_PAGESIZE);
    int a = fcntl(t->pipe_in[0], F_GETPIPE_SZ), b = fcntl(t->pipe_peer[0], F_GETPIPE_SZ);
    t->pipe_pages = a > 0 && b > 0 ? (size_t)DT_MIN(a, b) / t->page : 0;
    DT_LOG_DEBUG("shared memory: rank %d: the single-copy allreduce reads the other rank's pieces from a pipe (%zu "
                 "pages)", t->rank, t->pipe_pages);
  }
  *out = t;
  return DT_OK;
fail_unlink:
  shm_unlink(name);
fail:
  shm_destroy(t);
  return st;
}

/* ---- sendrecv over the rings ---- */

static dt_status shm_sendrecv_w(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf, size_t rn,
                                const dt__fp *fp, int64_t deadline, shm_wait *wp);

static dt_status shm_sendrecv(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf, size_t rn,
                              const dt__fp *fp, int64_t deadline) {
  shm_wait w = {0};
  dt_status st = shm_sendrecv_w(t, dst, sbuf, sn, src, rbuf, rn, fp, deadline, &w);
  shm_unarm(t, &w);
  return st;
}

static dt_status shm_sendrecv_w(dt_transport *t, int dst, const void *sbuf, size_t sn, int src, void *rbuf, size_t rn,
                                const dt__fp *fp, int64_t deadline, shm_wait *wp) {
  dt_comm *c = t->c;
  if ((dst >= 0 && (dst >= t->n || dst == t->rank)) || (src >= 0 && (src >= t->n || src == t->rank)))
    return dt_set_error(DT_ERR_INVALID, "rank %d: shm sendrecv with dst %d src %d of %d ranks", t->rank, dst, src, t->n);
  DT_CHECK(shm_usable(t));
  shm_board_set(t, fp);
  const uint64_t nslots = t->h->nslots, slot_bytes = t->h->slot_bytes;
  shm_ring *sr = dst >= 0 ? shm_ring_of(t, t->rank, dst) : NULL;
  shm_ring *rr = src >= 0 ? shm_ring_of(t, src, t->rank) : NULL;
  shm_ring *back = (dst >= 0 && dst != src) ? shm_ring_of(t, dst, t->rank) : NULL; /* where a NACK would come */
  bool s_pending = dst >= 0, r_pending = src >= 0;
  size_t s_done = 0, r_done = 0;
  bool r_first = true;
  bool ahead = false; /* the awaited peer was seen in a collective we have not started */
  for (;;) {
    uint32_t bell = atomic_load(shm_bell(t, -1));
    bool moved = false;
    while (s_pending) {
      uint64_t head = atomic_load_explicit(&sr->head, memory_order_relaxed);
      if (head - atomic_load_explicit(&sr->tail, memory_order_acquire) >= nslots)
        break;
      shm_slot *s = shm_slot_of(t, sr, head);
      size_t len = sn - s_done < slot_bytes ? sn - s_done : slot_bytes;
      s->fp = *fp;
      s->total = sn;
      s->off = s_done;
      s->len = (uint32_t)len;
      s->type = SHM_DATA;
      if (len)
        dt__copy((uint8_t *)s + SHM_SLOT_HDR, (const uint8_t *)sbuf + s_done, len);
      atomic_store_explicit(&sr->head, head + 1, memory_order_release);
      s_done += len;
      s_pending = s_done < sn;
      moved = true;
    }
    while (r_pending) {
      uint64_t tail = atomic_load_explicit(&rr->tail, memory_order_relaxed);
      if (atomic_load_explicit(&rr->head, memory_order_acquire) == tail)
        break;
      shm_slot *s = shm_slot_of(t, rr, tail);
      if (s->type == SHM_NACK || !dt__fp_equal(&s->fp, fp)) {
        dt__fp theirs = s->fp;
        bool nack = s->type == SHM_NACK;
        t->broken = true;
        if (nack) {
          dt__fp mine;
          memcpy(&mine, (uint8_t *)s + SHM_SLOT_HDR, sizeof mine);
          return dt__comm_mismatch(c, src, &theirs, &mine);
        } else {
          /* Tell the sender, if its ring back has room, so it reports both sides too. */
          shm_ring *nr = shm_ring_of(t, t->rank, src);
          uint64_t head = atomic_load_explicit(&nr->head, memory_order_relaxed);
          if (head - atomic_load_explicit(&nr->tail, memory_order_acquire) < nslots) {
            shm_slot *ns = shm_slot_of(t, nr, head);
            ns->fp = *fp;
            ns->total = ns->off = 0;
            ns->len = sizeof theirs;
            ns->type = SHM_NACK;
            memcpy((uint8_t *)ns + SHM_SLOT_HDR, &theirs, sizeof theirs); /* echo: the sender names both */
            atomic_store_explicit(&nr->head, head + 1, memory_order_release);
            shm_ring_bell(t);
          }
        }
        return dt__comm_mismatch(c, src, &theirs, fp);
      }
      if (s->total != rn || s->off != r_done || s->len > rn - r_done) {
        t->broken = true;
        char pn[64], what[160];
        dt__comm_peer_name(c, src, pn, sizeof pn);
        dt__fp_format(fp, what, sizeof what);
        return dt_set_error(DT_ERR_MISMATCH, "rank %d: %s sent %llu bytes for %s, rank %d expected %zu", t->rank, pn,
                            (unsigned long long)s->total, what, t->rank, rn);
      }
      if (s->len)
        dt__copy((uint8_t *)rbuf + r_done, (uint8_t *)s + SHM_SLOT_HDR, s->len);
      r_done += s->len;
      r_first = false;
      atomic_store_explicit(&rr->tail, tail + 1, memory_order_release);
      r_pending = r_done < rn;
      moved = true;
    }
    if (moved)
      shm_ring_bell(t);
    if (!s_pending && !r_pending)
      return DT_OK;
    if (moved) {
      shm_unarm(t, wp);
      ahead = false;
      continue;
    }
    if (back && s_pending) {
      uint64_t tail = atomic_load_explicit(&back->tail, memory_order_relaxed);
      if (atomic_load_explicit(&back->head, memory_order_acquire) != tail) {
        shm_slot *s = shm_slot_of(t, back, tail);
        if (s->type == SHM_NACK) {
          dt__fp theirs = s->fp, mine;
          memcpy(&mine, (uint8_t *)s + SHM_SLOT_HDR, sizeof mine);
          t->broken = true;
          return dt__comm_mismatch(c, dst, &theirs, &mine);
        }
      }
    }
    (void)r_first;
    /* Point to point is on no board, so a peer in a collective cannot see us: we tell (the job's
     * abort carries both calls to it), after one more look at the rings. */
    dt__fp theirs;
    if (fp->coll == DT_COLL_SEND && (wp->iter >= 64 || wp->phase) && shm_board_ahead(t, r_pending ? src : dst, &theirs)) {
      if (ahead) {
        t->broken = true;
        return dt__comm_mismatch(c, r_pending ? src : dst, &theirs, fp);
      }
      ahead = true;
      continue;
    }
    DT_CHECK(shm_pause(t, wp, -1, bell, r_pending ? src : dst, fp, deadline));
  }
}

/* ---- collectives made for shared memory ---- */

/* Waits until every rank's counter (at byte offset `field` of its record) reaches target. On
 * the way checks that each rank that got there was in the same call (fingerprint in its
 * record's fp[parity] when fps is non-NULL). */
static dt_status shm_wait_all_w(dt_transport *t, shm_wait *wp, size_t field, uint64_t target, size_t fp_field,
                                int parity, const dt__fp *fp, int64_t deadline);

static dt_status shm_wait_all(dt_transport *t, size_t field, uint64_t target, size_t fp_field, int parity,
                              const dt__fp *fp, int64_t deadline) {
  shm_wait w = {0};
  dt_status st = shm_wait_all_w(t, &w, field, target, fp_field, parity, fp, deadline);
  shm_unarm(t, &w);
  return st;
}

static dt_status shm_wait_all_w(dt_transport *t, shm_wait *wp, size_t field, uint64_t target, size_t fp_field,
                                int parity, const dt__fp *fp, int64_t deadline) {
  int r = 0;
  while (r < t->n) {
    uint32_t bell = atomic_load(shm_bell(t, r));
    _Atomic uint64_t *ctr = (_Atomic uint64_t *)((uint8_t *)&t->ranks[r] + field);
    if (atomic_load_explicit(ctr, memory_order_acquire) >= target) {
      if (fp_field) {
        const dt__fp *theirs = (const dt__fp *)((uint8_t *)&t->ranks[r] + fp_field) + parity;
        if (!dt__fp_equal(theirs, fp)) {
          dt__fp copy = *theirs;
          t->broken = true;
          return dt__comm_mismatch(t->c, r, &copy, fp);
        }
      }
      r++;
      shm_unarm(t, wp);
      continue;
    }
    DT_CHECK(shm_pause(t, wp, r, bell, r, fp, deadline));
  }
  return DT_OK;
}

static void shm_publish(dt_transport *t, size_t field, uint64_t v) {
  _Atomic uint64_t *ctr = (_Atomic uint64_t *)((uint8_t *)&t->ranks[t->rank] + field);
  atomic_store_explicit(ctr, v, memory_order_release);
  shm_ring_bell(t);
}

/* Elements [lo, hi) of a chunk of `len` elements that rank s reduces: slices are whole cache
 * lines so no two ranks write one line. */
static void shm_slice(size_t len, size_t es, int n, int s, size_t *lo, size_t *hi) {
  size_t unit = SHM_LINE / es ? SHM_LINE / es : 1;
  size_t units = (len + unit - 1) / unit;
  *lo = DT_MIN(len, units * (size_t)s / (size_t)n * unit);
  *hi = DT_MIN(len, units * (size_t)(s + 1) / (size_t)n * unit);
}

/* CI(k): waits until every rank copied chunk k-2 out of this staging buffer, then fills it with
 * every slice but this rank's own (which it reduces straight from its input). */
static dt_status shm_copy_in(dt_transport *t, const uint8_t *in, size_t count, size_t es, size_t ce, uint64_t base,
                             size_t k, const dt__fp *fp, int64_t deadline) {
  uint64_t g = base + k + 1;
  int b = (int)(g & 1);
  if (g > 2)
    DT_CHECK(shm_wait_all(t, offsetof(shm_rank, out_seq), g - 2, 0, 0, fp, deadline));
  size_t len = count ? DT_MIN(count - k * ce, ce) : 0, lo, hi;
  shm_slice(len, es, t->n, t->rank, &lo, &hi);
  uint8_t *stage = shm_stage(t, t->rank, b);
  const uint8_t *src = in + k * ce * es;
  if (lo)
    dt__copy(stage, src, lo * es);
  if (len > hi)
    dt__copy(stage + hi * es, src + hi * es, (len - hi) * es);
  t->ranks[t->rank].fp[b] = *fp;
  shm_publish(t, offsetof(shm_rank, in_seq), g);
  return DT_OK;
}

/* Two ranks, a call that stays in the caches (shm_cached: below 8 MiB), output not streamed: the
 * staged allreduce reduces its slice into the caller's output in blocks of this many bytes and
 * copies each block from there, still in L1, into its staging slice for the other rank, whose
 * copy-out then skips the own slice (one read and one write of the slice fewer; blocks this short
 * skip the reduction's software prefetch, which larger calls keep by going the old way). EPYC Zen
 * 3 guest, 2026-12-07, one-off builds alternated: with both ranks' CPUs near each other 1.1-1.25x
 * faster at 256 KiB-4 MiB on the staging buffers alone, 4 KiB blocks gaining less than 8; in jobs
 * where the host placed them far apart (2 MiB in 630-860 us instead of 200-250) 1.2-1.35x slower,
 * where the timed choice takes the single copy instead; with that choice 1.06-1.20x at 256 KiB-1
 * MiB and level from 2 MiB. At 4 ranks on the 2 vCPUs it read 0.65-0.87x, so more ranks keep the
 * copy-out of every slice (bench/results/staged-dual-2026-12-07i-zen3.txt). */
#define SHM_DIRECT_BLOCK (8u << 10)

/* Reduces elements [lo, hi) of chunk buffer b across all ranks into this rank's staging buffer:
 * own contribution (`own`, read from the caller's input) first, then the others in rank order,
 * in one pass (dt__reduce_many: f16/bf16 sums accumulate in f32 and are rounded once). With
 * `direct` (elements [lo, hi) of the caller's output, which may be `own`: elementwise) into
 * there first, SHM_DIRECT_BLOCK bytes at a time, each block then copied into the staging slice. */
static void shm_reduce_slice(dt_transport *t, int b, const uint8_t *own, uint8_t *direct, size_t lo, size_t hi,
                             size_t es, dt_dtype dt, dt_op op) {
  uint8_t *stage = shm_stage(t, t->rank, b) + lo * es;
  const size_t block = direct ? SHM_DIRECT_BLOCK / es : hi - lo;
  for (size_t e = 0; e < hi - lo; e += block) {
    const size_t ne = DT_MIN(block, hi - lo - e);
    int k = 0;
    t->srcs[k++] = own + e * es;
    for (int r = 0; r < t->n; r++)
      if (r != t->rank)
        t->srcs[k++] = shm_stage(t, r, b) + (lo + e) * es;
    uint8_t *dst = direct ? direct + e * es : stage + e * es;
    dt__reduce_many(dst, t->srcs, k, ne, dt, op, op == DT_AVG ? t->n : 1);
    if (direct)
      dt__copy(stage + e * es, dst, ne * es);
  }
}

/* Whether an allreduce of `bytes` per rank writes its output with non-temporal stores
 * (SHM_DEFAULT_NT). */
static bool shm_nt_use(const dt_transport *t, size_t bytes) {
  return t->nt_min && (uint64_t)bytes * 2 * (uint64_t)t->n >= t->nt_min;
}

/* Below this footprint (every rank's input and output, 2 x n x bytes) the allreduce's operands
 * stay in the caches from call to call, and its reductions are told so (dt__reduce_cached): they
 * then skip the software prefetch, which costs load slots and bought nothing there. Zen 5 guest,
 * 2 ranks, f32/f16/bf16 calls alternated in one job (bench/dtype_ab.c): f16 and bf16 allreduces
 * ran 0.95-0.97x f32's bytes/s at 512 KiB-4 MiB prefetching, 1.00-1.01x without; level at 8 MiB;
 * from 16 MiB (footprint 64 MiB) the prefetch kept them at 0.99-1.01x where dropping it
 * everywhere gave 0.97-0.98x (bench/results/pf-cached-2026-12-02-zen5.txt). The staging buffers'
 * reductions alike (the same guest, 2026-12-03, DTRAIN_SHM_CMA=off): f16/bf16 0.90-0.94x f32's
 * bytes/s at 256 KiB-4 MiB prefetching, 0.98-1.02x without; f32's own time level either way
 * (bench/results/pf-staged-2026-12-03-zen5.txt). */
#define SHM_CACHED_MAX ((uint64_t)32 << 20)
static bool shm_cached(const dt_transport *t, size_t bytes) {
  return (uint64_t)bytes * 2 * (uint64_t)t->n < SHM_CACHED_MAX;
}

/* What both allreduce paths do first: a world of one copies (and finishes the op, e.g. the
 * average's division); a transport broken by a mismatch or an aborted job refuses. *done is
 * true when nothing is left to do. */
static dt_status shm_allreduce_prelude(dt_transport *t, const uint8_t *in, uint8_t *out, size_t count, dt_dtype dt,
                                       dt_op op, bool *done) {
  *done = t->n == 1;
  if (*done) {
    if (in != out && count)
      memmove(out, in, count * dt_dtype_size(dt));
    dt__reduce_finish(out, count, dt, op, 1);
    return DT_OK;
  }
  return shm_usable(t);
}

/* ---- single-copy collectives ----
 * Between the ranks' own buffers with process_vm_readv/writev: every rank publishes its buffers'
 * addresses (cma_in, cma_out) with in_seq = g and waits until every rank did (the fingerprints
 * compared as for the staged paths), then reads from or writes into the others' buffers, then
 * publishes out_seq = g and waits until every rank did, so that no rank leaves while another may
 * still touch its buffers. g takes one chunk number of the staged paths' sequence. */

static bool shm_cma_use(dt_transport *t, size_t bytes) { return t->cma_min && bytes >= t->cma_min; }
/* allgather (bytes: a block) and broadcast */
static bool shm_cma_use_move(dt_transport *t, size_t bytes) { return t->cma_move_min && bytes >= t->cma_move_min; }
static size_t shm_single_copy(dt_transport *t) { return t->cma_move_min; }

/* Whether [p, p + n) lies in mappings of this process that are readable (and writable). Only
 * used to word an error, so reading /proc/self/maps is fine. */
static bool shm_range_mapped(const void *p, size_t n, bool write) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f)
    return true; /* cannot tell: do not blame our own buffer */
  uintptr_t at = (uintptr_t)p, end = at + n;
  unsigned long lo, hi;
  char perm[8];
  while (at < end && fscanf(f, "%lx-%lx %7s%*[^\n]", &lo, &hi, perm) == 3)
    if (lo <= at && at < hi && perm[0] == 'r' && (!write || perm[1] == 'w'))
      at = hi;
  fclose(f);
  return at >= end;
}

/* Copies `bytes` between `mine` and address `theirs` in rank r's process: from it (write false)
 * or into it (write true). One system call moves at most about 2 GiB (the kernel's MAX_RW_COUNT):
 * the rest follows in further calls. */
static dt_status shm_cma_move(dt_transport *t, int r, bool write, void *mine, uint64_t theirs, size_t bytes) {
  int pid = atomic_load_explicit(&t->ranks[r].pid, memory_order_relaxed);
  size_t done = 0;
  ssize_t got = 0;
  while (done < bytes) {
    struct iovec l = {(uint8_t *)mine + done, bytes - done}, rv = {(void *)(uintptr_t)(theirs + done), bytes - done};
    got = write ? process_vm_writev(pid, &l, 1, &rv, 1, 0) : process_vm_readv(pid, &l, 1, &rv, 1, 0);
    if (got <= 0)
      break;
    done += (size_t)got;
  }
  if (done == bytes)
    return DT_OK;
  int e = got < 0 ? errno : EFAULT; /* a copy that stops short met an unmapped page */
  if (e == ESRCH)
    return shm_dead(t, r, pid);
  char pn[64], me[64];
  dt__comm_peer_name(t->c, r, pn, sizeof pn);
  dt__comm_peer_name(t->c, t->rank, me, sizeof me);
  if (e == EFAULT && !shm_range_mapped((uint8_t *)mine + done, bytes - done, !write))
    return dt_set_error(DT_ERR_INVALID, "%s: its own buffer is not %s memory from byte %zu of the %zu this call moves "
                        "there (a buffer shorter than the call's count?)", me, write ? "readable" : "writable", done, bytes);
  if (e == EFAULT)
    return dt_set_error(DT_ERR_INVALID, "%s: %s's buffer is not %s memory in its process from byte %zu of the %zu this "
                        "call moves there (a buffer shorter than the call's count on %s?)", me, pn,
                        write ? "writable" : "readable", done, bytes, pn);
  return dt_set_error(DT_ERR_SYSTEM, "%s: %s %zu bytes %s %s (pid %d): %s (DTRAIN_SHM_CMA=off copies through shared "
                      "memory instead)", me, write ? "process_vm_writev of" : "process_vm_readv of", bytes,
                      write ? "to" : "from", pn, pid, strerror(e));
}

/* madvise(MADV_COLLAPSE) of len bytes at p, once more at once if the kernel found a page busy
 * (EAGAIN: one just faulted in may still be held by the per-CPU page lists); 0 or the errno. */
static int shm_collapse(uintptr_t p, size_t len) {
  for (int i = 0; i < 2; i++)
    if (madvise((void *)p, len, MADV_COLLAPSE) == 0)
      return 0;
    else if (errno != EAGAIN)
      break;
  return errno;
}

/* A large buffer met a second time (SHM_THP_MIN): its whole 2 MiB pages collapsed onto huge
 * pages, SHM_THP_STEP at a time, each part once, then the two its ends lie in. Before the
 * addresses are published, so no peer copies from or into the buffer meanwhile. */
static void shm_thp_meet(dt_transport *t, const void *p, size_t bytes) {
  if (!t->thp_step || bytes < SHM_THP_MIN)
    return;
  const uintptr_t h = (uintptr_t)2 << 20, at = (uintptr_t)p, lo = (at + h - 1) & ~(h - 1),
                  hi = (at + bytes) & ~(h - 1);
  const size_t inner = hi > lo ? hi - lo : 0; /* the whole 2 MiB pages within the buffer */
  for (unsigned i = 0; i < SHM_THP_SEEN; i++) {
    if (t->seen[i].at != at || t->seen[i].bytes != bytes)
      continue;
    size_t from = t->seen[i].done;
    if (from == SIZE_MAX)
      return;
    size_t len = DT_MIN(t->thp_step, inner - from);
    int e = len ? shm_collapse(lo + from, len) : 0;
    t->seen[i].done = !e && from + len < inner ? from + len : SIZE_MAX;
    if (e) /* no huge pages to spare, MADV_NOHUGEPAGE, an older kernel: leave it */
      DT_LOG_DEBUG("shared memory: madvise(MADV_COLLAPSE) of %zu bytes: %s (the buffer stays on small pages)", len,
                   strerror(e));
    else if (t->seen[i].done == SIZE_MAX) {
      /* The 2 MiB pages the buffer's two ends lie in, where its mapping holds them whole (the
       * kernel collapses no others, and leaves their contents as they are: the neighbours'
       * memory too, which another thread may be using; a page it finds pinned or changed
       * meanwhile fails the collapse). Best effort: a failure only leaves them small. */
      if (at & (h - 1))
        (void)shm_collapse(lo - h, h);
      if ((at + bytes) & (h - 1))
        (void)shm_collapse(hi, h);
    }
    return;
  }
  t->seen[t->seen_next].at = at;
  t->seen[t->seen_next].bytes = bytes;
  t->seen[t->seen_next].done = 0;
  t->seen_next = (t->seen_next + 1) % SHM_THP_SEEN;
}

/* DT_OK unless a rank left single-copy call g failed (cma_quit, published before its out_seq):
 * then what its failure became, the job's verdict (or its death, or the deadline), once it
 * arrives. */
static dt_status shm_cma_quitters(dt_transport *t, uint64_t g, const dt__fp *fp, int64_t deadline) {
  dt_status st = DT_OK;
  for (int r = 0; r < t->n && st == DT_OK; r++)
    if (r != t->rank && atomic_load(&t->ranks[r].cma_quit) == g) {
      shm_wait w = {0};
      while ((st = shm_pause(t, &w, r, atomic_load(shm_bell(t, r)), r, fp, deadline)) == DT_OK) {
      }
      shm_unarm(t, &w);
    }
  return st;
}

/* in/out: this rank's buffers, in_bytes and out_bytes long (the same buffer: in == out; in_bytes
 * 0: in lies within out). */
static dt_status shm_cma_begin(dt_transport *t, const void *in, size_t in_bytes, void *out, size_t out_bytes,
                               const dt__fp *fp, int64_t deadline) {
  DT_CHECK(shm_usable(t));
  shm_thp_meet(t, in, in_bytes);
  if (out != in || out_bytes != in_bytes)
    shm_thp_meet(t, out, out_bytes);
  shm_board_set(t, fp);
  shm_rank *me = &t->ranks[t->rank];
  me->cma_in = (uint64_t)(uintptr_t)in;
  me->cma_out = (uint64_t)(uintptr_t)out;
  uint64_t g = t->chunks + 1;
  /* only this call's parity: a rank still in call g - 1 may be reading the other one */
  me->fp[g & 1] = *fp;
  shm_publish(t, offsetof(shm_rank, in_seq), g);
  t->cma_g = g;
  dt_status st = shm_wait_all(t, offsetof(shm_rank, in_seq), g, offsetof(shm_rank, fp), (int)(g & 1), fp, deadline);
  if (st == DT_OK) {
    /* Before touching anyone's buffers: a rank that already left this call failed (its buffers
     * may be gone) means failing too. With shm_cma_drain's quit-then-look this is Dekker's
     * handshake: either it sees cma_go and waits for this rank's copies, or this rank sees its
     * cma_quit here and copies nothing. */
    atomic_store(&me->cma_go, g);
    st = shm_cma_quitters(t, g, fp, deadline);
  }
  if (st != DT_OK)
    t->broken = true;
  return st;
}

/* A single-copy call that failed on this rank after it published its buffers: others that
 * passed shm_cma_begin may be copying from or into them right now, and the caller frees or
 * reuses them once this returns (a write landing there later would corrupt this process, a read
 * fail with a misleading "buffer not readable"). So: say so (cma_quit, and out_seq = g: this
 * rank touches nothing more), then wait until every rank that may touch them (cma_go = g) has
 * left the call (out_seq >= g), died, or SHM_DRAIN_NS passed (a copy takes milliseconds; a
 * stopped rank is not waited for longer, and is named by the failure detector). */
#define SHM_DRAIN_NS 2000000000LL
static void shm_cma_drain(dt_transport *t, uint64_t g) {
  shm_rank *me = &t->ranks[t->rank];
  atomic_store(&me->cma_quit, g);
  shm_publish(t, offsetof(shm_rank, out_seq), g);
  const int64_t end = dt_now_ns() + SHM_DRAIN_NS;
  for (int r = 0; r < t->n; r++) {
    if (r == t->rank || atomic_load(&t->ranks[r].cma_go) != g)
      continue;
    int pid;
    while (atomic_load_explicit(&t->ranks[r].out_seq, memory_order_acquire) < g && shm_alive(t, r, &pid)) {
      if (dt_now_ns() >= end) {
        char pn[64];
        dt__comm_peer_name(t->c, r, pn, sizeof pn);
        DT_LOG_WARN("shared memory: %s has not left a failed single-copy call after %lld ms; leaving it (it may "
                    "still touch this rank's buffers)", pn, SHM_DRAIN_NS / 1000000);
        break;
      }
      sched_yield();
    }
  }
}

/* st: how the call went here; on failure the others are not waited for to finish the call
 * (they see a mismatch, an abort or this rank gone), only to stop touching this rank's buffers
 * (shm_cma_drain). */
static dt_status shm_cma_end(dt_transport *t, dt_status st, const dt__fp *fp, int64_t deadline) {
  uint64_t g = t->chunks + 1;
  if (st == DT_OK) {
    shm_publish(t, offsetof(shm_rank, out_seq), g);
    st = shm_wait_all(t, offsetof(shm_rank, out_seq), g, 0, 0, fp, deadline);
    /* a rank that quit published out_seq too, maybe without its part of the copies */
    if (st == DT_OK)
      st = shm_cma_quitters(t, g, fp, deadline);
  }
  if (st != DT_OK && t->cma_g == g)
    shm_cma_drain(t, g);
  if (st != DT_OK)
    t->broken = true;
  else
    t->chunks = g;
  return st;
}

static dt_status shm_allreduce_piped(dt_transport *t, const uint8_t *in, uint8_t *out, size_t count, dt_dtype dt,
                                     dt_op op, const dt__fp *fp, int64_t deadline);
static bool shm_pipe_fits(const dt_transport *t, size_t count, size_t es);

/* The other ranks' slices of one step: a slice is at most ceil(lines / n) whole lines of a
 * step (shm_slice); n - 1 of them. */
static uint8_t *shm_cma_buf(dt_transport *t) {
  const size_t lines = DT_MAX(SHM_NT_CHUNKS, t->cma_chunks) * t->h->chunk_bytes / SHM_LINE,
               most = (lines + (size_t)t->n - 1) / (size_t)t->n * SHM_LINE;
  if (!t->cma_buf)
    t->cma_buf = dt__alloc((size_t)(t->n - 1) * most);
  return t->cma_buf;
}

/* Allreduce, one copy: per step of cma_chunks chunks of the staged path's size (SHM_NT_CHUNKS
 * when streaming), rank s reads slice s of the chunk from every other rank's input into a cache-sized
 * buffer, reduces it with its own (own first, then the others in rank order, as the staged path)
 * into its output, and writes the result from there, still in cache, into every other rank's
 * output. Nobody waits for anybody between the
 * chunks: rank s only reads slice s of the others' inputs, and only it writes slice s of any
 * output; in place, slice s of rank r's buffer is read by rank s before rank s overwrites it.
 * Per rank the memory traffic is its input read once and its output written once, against the
 * staged path's extra copy-in and copy-out through the staging buffers. With a footprint beyond
 * the caches (shm_nt_use) the slice is reduced into the buffer, over the first other rank's part,
 * written to the others from there and streamed into this rank's output. */
static dt_status shm_allreduce_cma(dt_transport *t, const uint8_t *in, uint8_t *out, size_t count, dt_dtype dt,
                                   dt_op op, const dt__fp *fp, int64_t deadline) {
  const size_t es = dt_dtype_size(dt);
  const bool nt = shm_nt_use(t, count * es);
  if (t->piped && !nt && shm_pipe_fits(t, count, es))
    return shm_allreduce_piped(t, in, out, count, dt, op, fp, deadline);
  const size_t ce = t->h->chunk_bytes * (nt ? SHM_NT_CHUNKS : t->cma_chunks) / es; /* elements per step */
  if (!shm_cma_buf(t))
    return DT_ERR_NOMEM;
  dt_status st = shm_cma_begin(t, in, count * es, out, count * es, fp, deadline);
  for (size_t k = 0; st == DT_OK && k * ce < count; k++) {
    size_t len = DT_MIN(count - k * ce, ce), lo, hi;
    shm_slice(len, es, t->n, t->rank, &lo, &hi);
    size_t off = (k * ce + lo) * es, m = (hi - lo) * es;
    if (!m)
      continue;
    int j = 0;
    t->srcs[j++] = in + off;
    for (int r = 0; r < t->n && st == DT_OK; r++)
      if (r != t->rank) {
        uint8_t *dst = t->cma_buf + (size_t)(j - 1) * m;
        st = shm_cma_move(t, r, false, dst, t->ranks[r].cma_in + off, m);
        t->srcs[j++] = dst;
      }
    if (st != DT_OK)
      break;
    uint8_t *res = nt ? t->cma_buf : out + off; /* elementwise: it may alias t->srcs[1] */
    dt__reduce_many(res, t->srcs, j, hi - lo, dt, op, op == DT_AVG ? t->n : 1);
    for (int r = 0; r < t->n && st == DT_OK; r++)
      if (r != t->rank)
        st = shm_cma_move(t, r, true, res, t->ranks[r].cma_out + off, m);
    if (nt)
      dt__copy_nt(out + off, res, m);
  }
  return shm_cma_end(t, st, fp, deadline);
}

/* Whether every piece of an allreduce of `count` elements that either rank splices fits in the
 * pipes at once (the same answer on both: by the larger of the two slices of each chunk, each
 * spanning at most one page more than its length, wherever its buffer lies). */
static bool shm_pipe_fits(const dt_transport *t, size_t count, size_t es) {
  const size_t ce = t->h->chunk_bytes / es;
  size_t pages = 0;
  for (size_t k = 0; k * ce < count && pages <= t->pipe_pages; k++) {
    size_t len = DT_MIN(count - k * ce, ce), most = 0, lo, hi;
    for (int s = 0; s < 2; s++) {
      shm_slice(len, es, 2, s, &lo, &hi);
      most = DT_MAX(most, (hi - lo) * es);
    }
    pages += (most + t->page - 1) / t->page + 1;
  }
  return pages <= t->pipe_pages;
}

/* Splices `bytes` at p (this rank's memory) into the other rank's pipe, which has room for it
 * (shm_pipe_fits; a full one is waited for all the same). */
static dt_status shm_pipe_splice(dt_transport *t, const uint8_t *p, size_t bytes, const dt__fp *fp,
                                 int64_t deadline) {
  const int peer = 1 - t->rank;
  size_t done = 0;
  shm_wait w = {0};
  dt_status st = DT_OK;
  while (done < bytes && st == DT_OK) {
    uint32_t bell = atomic_load(shm_bell(t, peer));
    struct iovec v = {(void *)(p + done), bytes - done};
    ssize_t got = vmsplice(t->pipe_peer[1], &v, 1, SPLICE_F_NONBLOCK);
    if (got > 0)
      done += (size_t)got;
    else if (got < 0 && errno == EAGAIN)
      st = shm_pause(t, &w, peer, bell, peer, fp, deadline);
    else if (got == 0 || errno != EINTR) /* 0: nothing taken, which would repeat forever */
      break;
  }
  shm_unarm(t, &w);
  if (st != DT_OK || done == bytes)
    return st;
  char me[64];
  dt__comm_peer_name(t->c, t->rank, me, sizeof me);
  if (errno == EFAULT)
    return dt_set_error(DT_ERR_INVALID, "%s: its own buffer is not readable memory from byte %zu of the %zu this "
                        "call moves there (a buffer shorter than the call's count?)", me, done, bytes);
  return dt__errno(DT_ERR_SYSTEM, "%s: vmsplice of %zu bytes into the pipe to the other rank (DTRAIN_SHM_PIPE=off "
                   "copies with process_vm_readv/writev instead)", me, bytes);
}

/* Waits until the other rank spliced its pieces of this call (pushed = t->pushes), or left
 * call g failed. */
static dt_status shm_pipe_wait(dt_transport *t, uint64_t g, const dt__fp *fp, int64_t deadline) {
  const int peer = 1 - t->rank;
  shm_wait w = {0};
  dt_status st = DT_OK;
  for (;;) {
    uint32_t bell = atomic_load(shm_bell(t, peer));
    if (atomic_load_explicit(&t->ranks[peer].pushed, memory_order_acquire) >= t->pushes)
      break;
    if (atomic_load(&t->ranks[peer].cma_quit) == g) {
      st = shm_cma_quitters(t, g, fp, deadline);
      break;
    }
    if ((st = shm_pause(t, &w, peer, bell, peer, fp, deadline)) != DT_OK)
      break;
  }
  shm_unarm(t, &w);
  return st;
}

/* Reads the next `bytes` the other rank spliced (all there: shm_pipe_wait) into dst. */
static dt_status shm_pipe_read(dt_transport *t, uint8_t *dst, size_t bytes) {
  size_t done = 0;
  ssize_t got = 0;
  while (done < bytes && ((got = read(t->pipe_in[0], dst + done, bytes - done)) > 0 || (got < 0 && errno == EINTR)))
    if (got > 0)
      done += (size_t)got;
  if (done == bytes)
    return DT_OK;
  char me[64], pn[64];
  dt__comm_peer_name(t->c, t->rank, me, sizeof me);
  dt__comm_peer_name(t->c, 1 - t->rank, pn, sizeof pn);
  if (got < 0 && errno == EFAULT)
    return dt_set_error(DT_ERR_INVALID, "%s: its own buffer is not writable memory from byte %zu of the %zu this call "
                        "moves there (a buffer shorter than the call's count?)", me, done, bytes);
  return dt_set_error(DT_ERR_PROTOCOL, "%s: the pipe from %s held %zu of the %zu bytes of its piece%s%s", me, pn, done,
                      bytes, got < 0 ? ": " : "", got < 0 ? strerror(errno) : "");
}

/* The single-copy allreduce of two ranks with a pipe each (SHM_PIPE): each rank splices the
 * other's slice of every chunk of its input into the other's pipe at once, then per chunk reads
 * its own slice of the other's input from its pipe into a cache-sized buffer, reduces it with its
 * own (own first, as every path) into its output and writes the result from there into the
 * other's output (process_vm_writev, as shm_allreduce_cma). In place, the other overwrites a
 * slice this rank spliced only after reading it; shm_cma_end's wait keeps every rank in the call
 * until the other read all it spliced. */
static dt_status shm_allreduce_piped(dt_transport *t, const uint8_t *in, uint8_t *out, size_t count, dt_dtype dt,
                                     dt_op op, const dt__fp *fp, int64_t deadline) {
  const size_t es = dt_dtype_size(dt), ce = t->h->chunk_bytes / es; /* elements per chunk */
  const int peer = 1 - t->rank;
  if (!shm_cma_buf(t))
    return DT_ERR_NOMEM;
  dt_status st = shm_cma_begin(t, in, count * es, out, count * es, fp, deadline);
  uint64_t g = t->cma_g;
  size_t lo, hi;
  for (size_t k = 0; st == DT_OK && k * ce < count; k++) {
    size_t len = DT_MIN(count - k * ce, ce);
    shm_slice(len, es, 2, peer, &lo, &hi);
    if (hi > lo)
      st = shm_pipe_splice(t, in + (k * ce + lo) * es, (hi - lo) * es, fp, deadline);
  }
  if (st == DT_OK) {
    shm_publish(t, offsetof(shm_rank, pushed), ++t->pushes);
    st = shm_pipe_wait(t, g, fp, deadline);
  }
  for (size_t k = 0; st == DT_OK && k * ce < count; k++) {
    size_t len = DT_MIN(count - k * ce, ce);
    shm_slice(len, es, 2, t->rank, &lo, &hi);
    size_t off = (k * ce + lo) * es, m = (hi - lo) * es;
    if (!m)
      continue;
    if ((st = shm_pipe_read(t, t->cma_buf, m)) != DT_OK)
      break;
    t->srcs[0] = in + off;
    t->srcs[1] = t->cma_buf;
    dt__reduce_many(out + off, t->srcs, 2, hi - lo, dt, op, op == DT_AVG ? 2 : 1);
    st = shm_cma_move(t, peer, true, out + off, t->ranks[peer].cma_out + off, m);
  }
  return shm_cma_end(t, st, fp, deadline);
}

/* Allgather, one copy: every rank writes its block into every other rank's output; two ranks
 * whose block fits in the pipes (SHM_PIPE) splice it from their input into the other's pipe, and
 * each reads the other's into its output meanwhile copying its own. */
static dt_status shm_allgather_cma(dt_transport *t, const uint8_t *in, uint8_t *out, size_t bytes, const dt__fp *fp,
                                   int64_t deadline) {
  uint8_t *own = out + (size_t)t->rank * bytes;
  if (t->piped && (bytes + t->page - 1) / t->page + 1 <= t->pipe_pages) { /* SHM_PIPE */
    dt_status st = shm_cma_begin(t, own, 0, out, bytes * 2, fp, deadline);
    if (st == DT_OK)
      st = shm_pipe_splice(t, in, bytes, fp, deadline);
    if (st == DT_OK) {
      shm_publish(t, offsetof(shm_rank, pushed), ++t->pushes);
      if (in != own)
        dt__copy(own, in, bytes);
      st = shm_pipe_wait(t, t->cma_g, fp, deadline);
    }
    if (st == DT_OK)
      st = shm_pipe_read(t, out + (size_t)(1 - t->rank) * bytes, bytes);
    return shm_cma_end(t, st, fp, deadline);
  }
  if (in != own)
    dt__copy(own, in, bytes);
  dt_status st = shm_cma_begin(t, own, 0, out, bytes * (size_t)t->n, fp, deadline);
  for (int i = 1; i < t->n && st == DT_OK; i++) { /* rank + 1 first, so that no rank is everybody's first */
    int r = (t->rank + i) % t->n;
    st = shm_cma_move(t, r, true, own, t->ranks[r].cma_out + (size_t)t->rank * bytes, bytes);
  }
  return shm_cma_end(t, st, fp, deadline);
}

/* Broadcast, one copy, by both ends at once: the root writes the first 1/n of its buffer (whole
 * cache lines) into every other rank's, and every other rank reads the rest. (Only the readers
 * copying: 64 MiB at 2 ranks took 17-18 ms against the staged path's 12, whose two copies run on
 * both cores at once; `dtrain bench broadcast -n 2 --transport shm --algo shm`.) */
static dt_status shm_broadcast_cma(dt_transport *t, uint8_t *buf, size_t bytes, int root, const dt__fp *fp,
                                   int64_t deadline) {
  size_t head = DT_MIN(bytes, shm_align(bytes / (size_t)t->n, SHM_LINE));
  dt_status st = shm_cma_begin(t, buf, bytes, buf, bytes, fp, deadline);
  for (int i = 1; i < t->n && st == DT_OK && t->rank == root && head; i++) {
    int r = (root + i) % t->n;
    st = shm_cma_move(t, r, true, buf, t->ranks[r].cma_out, head);
  }
  if (st == DT_OK && t->rank != root && bytes > head)
    st = shm_cma_move(t, root, false, buf + head, t->ranks[root].cma_in + head, bytes - head);
  return shm_cma_end(t, st, fp, deadline);
}

/* The least size of a collective's class 0, as a power of two: the allreduce's from 64 KiB, the
 * broadcast's and the allgather's from 16 KiB. */
static unsigned shm_tune_lo(int kind) { return kind == SHM_TUNE_ALLREDUCE ? 16 : 14; }

static unsigned shm_tune_class(int kind, size_t bytes) {
  unsigned c = 0;
  for (size_t b = bytes >> (shm_tune_lo(kind) + 1); b && c + 1 < SHM_TUNE_CLASSES; b >>= 1)
    c++;
  return c;
}

/* The path allreduce call number `call` of class c takes: 1 the staging buffers, 0 the single
 * copy. Rank 0 first moves the class's plan on, for calls from call + 1. It may: every other
 * rank has already read the plan for every call before this one (rank 0 finished call - 1,
 * with their parts, and a rank reads the plan before it takes part), and rank 0 changes a plan
 * only once its last change holds for this call (epoch <= call), so the new plan's bit 1 (the
 * path before call + 1) is the path this call takes by either plan. The others see the new plan
 * before they start call + 1: they first wait for what rank 0 publishes in this call, after
 * this store. */
static int shm_tune_pick(dt_transport *t, int kind, unsigned c, uint64_t call) {
  static const char *const names[SHM_TUNE_KINDS] = {"allreduces", "broadcasts", "allgathers"};
  _Atomic uint64_t *at = &t->h->plan[kind][c];
  uint64_t plan = atomic_load_explicit(at, memory_order_acquire);
  int path = call >= plan >> 2 ? (int)(plan & 1) : (int)(plan >> 1 & 1);
  if (t->rank != 0 || (plan >> 2) > call)
    return path;
  dt__shm_tune *u = &t->tunes[kind][c];
  const bool probing = u->probe != 0;
  const int want = dt__shm_tune_next(u, path);
  if (want != (int)(plan & 1)) {
    atomic_store_explicit(at, (call + 1) << 2 | (uint64_t)path << 1 | (uint64_t)want, memory_order_release);
    DT_LOG_DEBUG("shared memory: %s of %zu KiB and up to twice that take the %s from call %llu (%s; "
                 "least us per MiB of their last timed calls: single copy %.1f, staging buffers %.1f)", names[kind],
                 ((size_t)1 << shm_tune_lo(kind)) >> 10 << c, want ? "staging buffers" : "single copy",
                 (unsigned long long)call + 1,
                 u->probe ? "timing the other path" : probing ? "back after timing the other path" : "the faster",
                 dt__shm_tune_least(u, 0) * 1048.576, dt__shm_tune_least(u, 1) * 1048.576);
  }
  return path;
}

#define SHM_TOOK_NS ((UINT64_C(1) << 40) - 1)
#define SHM_TOOK_CALL(call) (((call) & 0xffffffu) << 40)

/* The path of broadcast or allgather (kind) call number `call` of `bytes` per block, timed
 * (SHM_TUNE_KINDS). 1: the staging buffers. */
static int shm_move_pick(dt_transport *t, int kind, size_t bytes, uint64_t call) {
  const unsigned cls = shm_tune_class(kind, bytes);
  const int path = shm_tune_pick(t, kind, cls, call);
  if (t->rank == 0)
    t->past[kind - 1][call % SHM_TOOK] = (shm_past){.cls = cls, .path = path, .bytes = bytes};
  return path;
}

/* After broadcast or allgather (kind) call number `call`, begun at t0: publishes this rank's time
 * of it, and rank 0 records the slowest rank's time of the call before, which every rank
 * published before it started this one (a release its publications in this call carry, which
 * rank 0 acquired: it saw every rank start this call). Last in the call, so the slower path's
 * root or peer is not kept waiting while rank 0 reads the others' times. */
static void shm_move_took(dt_transport *t, int kind, uint64_t call, int64_t t0) {
  const uint64_t ns = DT_MIN((uint64_t)(dt_now_ns() - t0), SHM_TOOK_NS);
  atomic_store_explicit(&t->ranks[t->rank].took[kind - 1][call % SHM_TOOK], SHM_TOOK_CALL(call) | ns,
                        memory_order_relaxed);
  if (t->rank != 0 || call < 2)
    return;
  const uint64_t was = call - 1;
  uint64_t most = 0;
  for (int r = 0; r < t->n; r++) {
    uint64_t v = atomic_load_explicit(&t->ranks[r].took[kind - 1][was % SHM_TOOK], memory_order_relaxed);
    if ((v & ~SHM_TOOK_NS) != SHM_TOOK_CALL(was))
      return; /* never, as above; a slip would only lose a timing */
    most = DT_MAX(most, v & SHM_TOOK_NS);
  }
  const shm_past *p = &t->past[kind - 1][was % SHM_TOOK];
  dt__shm_tune_record(&t->tunes[kind][p->cls], p->path, (double)most / (double)p->bytes);
}

/* The path of a broadcast or allgather (kind) of `bytes` per block: 1 the staging buffers, 0 the
 * single copy (from cma_move_min bytes; fixed by DTRAIN_SHM_CMA, else timed). A timed call gets
 * its number in *call and its start in *t0 for shm_move_took; others get *call = 0. */
static int shm_move_path(dt_transport *t, int kind, size_t bytes, uint64_t *call, int64_t *t0) {
  *call = 0;
  if (!shm_cma_use_move(t, bytes))
    return 1;
  if (!t->tune)
    return 0;
  *call = ++t->calls[kind];
  *t0 = dt_now_ns();
  return shm_move_pick(t, kind, bytes, *call);
}

/* Allreduce for shared memory. Per chunk (double-buffered): every rank copies its input chunk
 * into its staging buffer (CI; all but its own slice), rank s reduces slice s from its input
 * and the other ranks' staging buffers into its staging buffer (R), and every rank copies the reduced slices out (CO). Order per rank: CI(0), then
 * for each chunk k: R(k), CI(k+1), CO(k), so a rank's copy-in of the next chunk overlaps the
 * others' reductions. A staging buffer is reused two chunks later, only after every rank
 * copied that chunk out. Each slice is reduced by one rank in rank order, so every rank gets
 * bit-identical results. */
static dt_status shm_allreduce_staged(dt_transport *t, const uint8_t *in, uint8_t *out, size_t count, dt_dtype dt,
                                      dt_op op, const dt__fp *fp, int64_t deadline) {
  const size_t es = dt_dtype_size(dt);
  shm_board_set(t, fp);
  const bool nt = shm_nt_use(t, count * es); /* the copy-out streams past the caches */
  const bool direct = !nt && t->n == 2 && shm_cached(t, count * es); /* SHM_DIRECT_BLOCK */
  const size_t ce = t->h->chunk_bytes / es; /* elements per chunk */
  const size_t nchunks = count ? (count + ce - 1) / ce : 1;
  const uint64_t base = t->chunks;
  const size_t f_in = offsetof(shm_rank, in_seq), f_red = offsetof(shm_rank, red_seq),
               f_fp = offsetof(shm_rank, fp);
  dt_status st = DT_OK;
  DT_CHECK_GOTO(shm_copy_in(t, in, count, es, ce, base, 0, fp, deadline), st, fail);
  for (size_t k = 0; k < nchunks; k++) {
    uint64_t g = base + k + 1;
    int b = (int)(g & 1);
    size_t len = count ? DT_MIN(count - k * ce, ce) : 0, lo, hi;
    /* R(k): own contribution first, then the others in rank order. */
    DT_CHECK_GOTO(shm_wait_all(t, f_in, g, f_fp, b, fp, deadline), st, fail);
    shm_slice(len, es, t->n, t->rank, &lo, &hi);
    if (hi > lo)
      shm_reduce_slice(t, b, in + (k * ce + lo) * es, direct ? out + (k * ce + lo) * es : NULL, lo, hi, es, dt, op);
    shm_publish(t, f_red, g);
    /* CI(k+1) overlaps the other ranks' R(k). */
    if (k + 1 < nchunks)
      DT_CHECK_GOTO(shm_copy_in(t, in, count, es, ce, base, k + 1, fp, deadline), st, fail);
    /* CO(k) */
    DT_CHECK_GOTO(shm_wait_all(t, f_red, g, 0, 0, fp, deadline), st, fail);
    for (int s = 0; s < t->n && len; s++) {
      shm_slice(len, es, t->n, s, &lo, &hi);
      if (hi > lo && !(direct && s == t->rank))
        (nt ? dt__copy_nt : dt__copy)(out + (k * ce + lo) * es, shm_stage(t, s, b) + lo * es, (hi - lo) * es);
    }
    shm_publish(t, offsetof(shm_rank, out_seq), g);
  }
  t->chunks = base + nchunks;
  return DT_OK;
fail:
  t->broken = true;
  return st;
}

/* Allreduce for shared memory: from cma_min bytes the single copy or the staging buffers, as
 * timed (SHM_TUNE_CLASSES), below the staging buffers. Either way the reductions skip the
 * software prefetch while the call's footprint stays in the caches (shm_cached). */
static dt_status shm_allreduce(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt, dt_op op,
                               const dt__fp *fp, int64_t deadline) {
  const size_t bytes = count * dt_dtype_size(dt);
  const uint8_t *in = (sbuf == DT_IN_PLACE) ? rbuf : sbuf;
  uint8_t *out = rbuf;
  bool done;
  dt_status st = shm_allreduce_prelude(t, in, out, count, dt, op, &done);
  if (st != DT_OK || done)
    return st;
  const unsigned cls = shm_tune_class(SHM_TUNE_ALLREDUCE, bytes);
  int64_t t0 = 0;
  bool cma = shm_cma_use(t, bytes);
  if (cma && t->tune) {
    cma = !shm_tune_pick(t, SHM_TUNE_ALLREDUCE, cls, ++t->calls[SHM_TUNE_ALLREDUCE]);
    t0 = t->rank == 0 ? dt_now_ns() : 0;
  }
  bool was = dt__reduce_cached(shm_cached(t, bytes));
  st = (cma ? shm_allreduce_cma : shm_allreduce_staged)(t, in, out, count, dt, op, fp, deadline);
  dt__reduce_cached(was);
  if (t0 && st == DT_OK)
    dt__shm_tune_record(&t->tunes[SHM_TUNE_ALLREDUCE][cls], !cma, (double)(dt_now_ns() - t0) / (double)bytes);
  return st;
}

/* Waits until rank r's flat slot holds round g (spinning, then as shm_pause says), and checks
 * that r made the same call. */
static dt_status shm_flat_wait(dt_transport *t, int r, shm_flat *s, uint64_t g, const uint64_t *mine,
                               const dt__fp *fp, int64_t *deadline) {
  if (atomic_load_explicit(&s->g, memory_order_acquire) != g) {
    if (!*deadline) /* the call's deadline starts at its first wait (collectives.c passes 0) */
      *deadline = dt__comm_deadline(t->c);
    shm_wait w = {0};
    dt_status st = DT_OK;
    for (;;) {
      uint32_t bell = atomic_load_explicit(shm_bell(t, r), memory_order_relaxed);
      if (atomic_load_explicit(&s->g, memory_order_acquire) == g)
        break;
      if ((st = shm_pause(t, &w, r, bell, r, fp, *deadline)) != DT_OK)
        break;
    }
    shm_unarm(t, &w);
    if (st)
      return st;
  }
  /* The slot cannot change under us: r rewrites it two rounds later, after it saw our slot of
   * the round in between, which we publish only when done reading this one. */
  for (int i = 0; i < 3; i++)
    if (atomic_load_explicit(&s->fp[i], memory_order_relaxed) != mine[i]) {
      uint64_t w[3];
      for (int j = 0; j < 3; j++)
        w[j] = atomic_load_explicit(&s->fp[j], memory_order_relaxed);
      dt__fp theirs;
      memcpy(&theirs, w, sizeof theirs);
      t->broken = true;
      return dt__comm_mismatch(t->c, r, &theirs, fp);
    }
  return DT_OK;
}

/* This rank's slot for flat round g, opened for writing: g = 0 (the board skips the slot while it
 * is rewritten, a seqlock), then the call's fingerprint; the caller writes its data and
 * publishes the round with shm_flat_close. */
static shm_flat *shm_flat_open(dt_transport *t, uint64_t g, const uint64_t *mine) {
  shm_flat *own = shm_flat_of(t, t->rank, (int)(g & 1));
  /* g = 0 first (the release stores of the words order it before them), g = round last */
  atomic_store_explicit(&own->g, 0, memory_order_relaxed);
  for (int i = 0; i < 3; i++)
    atomic_store_explicit(&own->fp[i], mine[i], memory_order_release);
  return own;
}
static void shm_flat_close(dt_transport *t, shm_flat *own, uint64_t g) {
  atomic_store_explicit(&own->g, g, memory_order_release);
  shm_ring_bell(t);
}
/* Posts `bytes` from src (nothing when 0) as this rank's part of flat round g. */
static void shm_flat_post(dt_transport *t, uint64_t g, const uint64_t *mine, const uint8_t *src, size_t bytes) {
  shm_flat *own = shm_flat_open(t, g, mine);
  if (bytes)
    dt__copy(own->data, src, bytes);
  shm_flat_close(t, own, g);
}

/* Waits for every other rank's slot of round g (checking that each made the same call). */
static dt_status shm_flat_wait_all(dt_transport *t, uint64_t g, const uint64_t *mine, const dt__fp *fp,
                                   int64_t *deadline) {
  for (int r = 0; r < t->n; r++)
    if (r != t->rank)
      DT_CHECK(shm_flat_wait(t, r, shm_flat_of(t, r, (int)(g & 1)), g, mine, fp, deadline));
  return DT_OK;
}

/* Flat allreduce for small buffers: one round per piece of up to flat_bytes. Every rank copies
 * its piece into its own slot (parity of the round), publishes the round number with the call's
 * fingerprint, waits for every other rank's slot of that round and reduces all slots in rank
 * order itself, so every rank computes the same bits. Nothing else is waited for: a slot is
 * reused two rounds later, and by then every rank has published the round in between, which it
 * does only after it finished reading this one. No progress counters, no call board (the slot's
 * fingerprint serves other waiters' mismatch checks), no bell unless someone sleeps. */
static dt_status shm_allreduce_flat(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                                    dt_op op, const dt__fp *fp, int64_t deadline) {
  size_t es = dt_dtype_size(dt);
  const uint8_t *in = (sbuf == DT_IN_PLACE) ? rbuf : sbuf;
  uint8_t *out = rbuf;
  bool done;
  dt_status pre = shm_allreduce_prelude(t, in, out, count, dt, op, &done);
  if (pre != DT_OK || done)
    return pre;
  uint64_t mine[3];
  memcpy(mine, fp, sizeof mine);
  const size_t per = t->h->flat_bytes / es;
  const size_t npieces = count ? (count + per - 1) / per : 1;
  const int n = t->n, div = op == DT_AVG ? n : 1;
  /* Two ranks, half types: this rank's piece (its first SHM_FLAT_PRE elements) is widened to f32
   * while the other's is on its way, so only the other's conversion and the rounding are left
   * once it is there (the same operations in rank order: the same bits as dt__reduce_many). */
  float *wide = t->wide;
  const bool ahead = wide && (dt == DT_F16 || dt == DT_BF16);
  dt_status st = DT_OK;
  for (size_t k = 0; k < npieces; k++) {
    uint64_t g = ++t->flats;
    int p = (int)(g & 1);
    size_t m = count ? DT_MIN(per, count - k * per) : 0;
    shm_flat_post(t, g, mine, in + k * per * es, m * es);
    size_t wn = ahead ? DT_MIN(m, (size_t)SHM_FLAT_PRE) : 0; /* widened ahead: [0, wn) */
    if (wn)
      dt__to_f32(wide, in + k * per * es, wn, dt);
    DT_CHECK_GOTO(shm_flat_wait_all(t, g, mine, fp, &deadline), st, fail);
    if (!m)
      continue;
    if (wn) {
      const void *peer = shm_flat_of(t, 1 - t->rank, p)->data;
      if (t->rank == 0)
        dt__reduce_mix(out + k * per * es, dt, wide, DT_F32, peer, dt, wn, op, div);
      else
        dt__reduce_mix(out + k * per * es, dt, peer, dt, wide, DT_F32, wn, op, div);
      if (wn == m)
        continue;
    }
    for (int r = 0; r < n; r++)
      t->srcs[r] = shm_flat_of(t, r, p)->data + wn * es;
    dt__reduce_many(out + (k * per + wn) * es, t->srcs, n, m - wn, dt, op, div);
  }
  return DT_OK;
fail:
  t->broken = true;
  return st;
}

/* Common frame of the two-phase fast paths (broadcast, allgather, reduce_scatter): for chunk k
 * (global number g), fill() writes this rank's staging buffer (if it contributes), every rank
 * publishes in_seq = g, waits for all (checking fingerprints), consume() reads what it needs,
 * and every rank publishes out_seq = g. A buffer is refilled only after every rank consumed the
 * chunk that used it two chunks earlier. */
typedef struct shm_phase {
  const uint8_t *in;
  uint8_t *out;
  size_t count, es, per; /* elements per block; element size; elements per block per chunk */
  int root;
  dt_dtype dt;
  dt_op op;
} shm_phase;

typedef void (*shm_fill_fn)(dt_transport *t, const shm_phase *p, size_t k, uint8_t *stage);
typedef dt_status (*shm_consume_fn)(dt_transport *t, const shm_phase *p, size_t k, int b);

static dt_status shm_two_phase(dt_transport *t, const shm_phase *p, size_t nchunks, shm_fill_fn fill,
                               shm_consume_fn consume, const dt__fp *fp, int64_t deadline) {
  DT_CHECK(shm_usable(t));
  shm_board_set(t, fp);
  const uint64_t base = t->chunks;
  dt_status st = DT_OK;
  for (size_t k = 0; k < nchunks; k++) {
    uint64_t g = base + k + 1;
    int b = (int)(g & 1);
    if (g > 2)
      DT_CHECK_GOTO(shm_wait_all(t, offsetof(shm_rank, out_seq), g - 2, 0, 0, fp, deadline), st, fail);
    if (fill)
      fill(t, p, k, shm_stage(t, t->rank, b));
    t->ranks[t->rank].fp[b] = *fp;
    shm_publish(t, offsetof(shm_rank, in_seq), g);
    DT_CHECK_GOTO(shm_wait_all(t, offsetof(shm_rank, in_seq), g, offsetof(shm_rank, fp), b, fp, deadline), st, fail);
    DT_CHECK_GOTO(consume(t, p, k, b), st, fail);
    shm_publish(t, offsetof(shm_rank, out_seq), g);
  }
  t->chunks = base + nchunks;
  return DT_OK;
fail:
  t->broken = true;
  return st;
}

static size_t shm_piece(const shm_phase *p, size_t k) {
  return p->count > k * p->per ? DT_MIN(p->per, p->count - k * p->per) : 0;
}

/* broadcast: the root fills, everybody else copies out. */
static void bcast_fill(dt_transport *t, const shm_phase *p, size_t k, uint8_t *stage) {
  size_t m = shm_piece(p, k);
  if (t->rank == p->root && m)
    dt__copy(stage, p->out + k * p->per * p->es, m * p->es);
}
static dt_status bcast_consume(dt_transport *t, const shm_phase *p, size_t k, int b) {
  size_t m = shm_piece(p, k);
  if (t->rank != p->root && m)
    dt__copy(p->out + k * p->per * p->es, shm_stage(t, p->root, b), m * p->es);
  return DT_OK;
}

/* From cma_move_min bytes the single copy or the staging buffers, as timed (shm_move_pick), below
 * the staging buffers. */
static dt_status shm_broadcast(dt_transport *t, void *buf, size_t count, dt_dtype dt, int root, const dt__fp *fp,
                               int64_t deadline) {
  if (t->n == 1)
    return DT_OK;
  const size_t bytes = count * dt_dtype_size(dt);
  uint64_t call;
  int64_t t0 = 0;
  dt_status st;
  if (!shm_move_path(t, SHM_TUNE_BROADCAST, bytes, &call, &t0)) {
    st = shm_broadcast_cma(t, buf, bytes, root, fp, deadline);
  } else {
    shm_phase p = {.out = buf, .count = count, .es = dt_dtype_size(dt), .root = root, .dt = dt};
    p.per = t->h->chunk_bytes / p.es;
    size_t nchunks = count ? (count + p.per - 1) / p.per : 1;
    st = shm_two_phase(t, &p, nchunks, bcast_fill, bcast_consume, fp, deadline);
  }
  if (st == DT_OK && call)
    shm_move_took(t, SHM_TUNE_BROADCAST, call, t0);
  return st;
}

/* allgather: everybody fills its piece and copies it to its own block of the output while it is
 * in cache (161 -> 142-149 us for 1 MiB on 2 ranks of the Xeon guest, `dtrain bench allgather -n
 * 2 --transport shm --sizes 64K:4M --iters 200`), then copies every other rank's piece out. */
static void gather_fill(dt_transport *t, const shm_phase *p, size_t k, uint8_t *stage) {
  size_t m = shm_piece(p, k);
  if (m)
    dt__copy(stage, p->in + k * p->per * p->es, m * p->es);
  size_t blk = p->count * p->es;
  if (m && p->in != p->out + (size_t)t->rank * blk)
    dt__copy(p->out + (size_t)t->rank * blk + k * p->per * p->es, p->in + k * p->per * p->es, m * p->es);
}
static dt_status gather_consume(dt_transport *t, const shm_phase *p, size_t k, int b) {
  size_t m = shm_piece(p, k), blk = p->count * p->es;
  for (int s = 0; s < t->n && m; s++)
    if (s != t->rank)
      dt__copy(p->out + (size_t)s * blk + k * p->per * p->es, shm_stage(t, s, b), m * p->es);
  return DT_OK;
}

static dt_status shm_allgather(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                               const dt__fp *fp, int64_t deadline) {
  size_t es = dt_dtype_size(dt);
  uint8_t *out = rbuf;
  const uint8_t *in = sbuf == DT_IN_PLACE ? out + (size_t)t->rank * count * es : sbuf;
  if (t->n == 1) {
    if (in != out && count)
      memmove(out, in, count * es);
    return DT_OK;
  }
  uint64_t call;
  int64_t t0 = 0;
  dt_status st;
  if (!shm_move_path(t, SHM_TUNE_ALLGATHER, count * es, &call, &t0)) {
    st = shm_allgather_cma(t, in, out, count * es, fp, deadline);
  } else {
    shm_phase p = {.in = in, .out = out, .count = count, .es = es, .dt = dt};
    p.per = t->h->chunk_bytes / es;
    size_t nchunks = count ? (count + p.per - 1) / p.per : 1;
    st = shm_two_phase(t, &p, nchunks, gather_fill, gather_consume, fp, deadline);
  }
  if (st == DT_OK && call)
    shm_move_took(t, SHM_TUNE_ALLGATHER, call, t0);
  return st;
}

/* reduce_scatter: each chunk holds `per` elements of every block (block s at s * per); rank r
 * reduces block r's piece across the other ranks' staging buffers and its own input straight
 * into its output. A rank's own block never goes through its staging buffer (nobody else reads
 * it there): that saves 1/n of the copies, which ZeRO-1's reduce-scatter of every gradient
 * bucket pays each step. In place the output is the input's block 0, so rank 0 reduces its own
 * piece onto itself (dt__reduce_many allows out == src[0]) and a rank r > 0 writes over block 0's
 * piece k only after staging it, while its own block r lies outside the output. */
static void rs_fill(dt_transport *t, const shm_phase *p, size_t k, uint8_t *stage) {
  size_t m = shm_piece(p, k);
  for (int s = 0; s < t->n && m; s++)
    if (s != t->rank)
      dt__copy(stage + (size_t)s * p->per * p->es, p->in + ((size_t)s * p->count + k * p->per) * p->es, m * p->es);
}
static dt_status rs_consume(dt_transport *t, const shm_phase *p, size_t k, int b) {
  size_t m = shm_piece(p, k);
  if (!m)
    return DT_OK;
  size_t off = (size_t)t->rank * p->per * p->es;
  for (int s = 0; s < t->n; s++)
    t->srcs[s] = s == t->rank ? p->in + ((size_t)s * p->count + k * p->per) * p->es : shm_stage(t, s, b) + off;
  dt__reduce_many(p->out + k * p->per * p->es, t->srcs, t->n, m, p->dt, p->op, p->op == DT_AVG ? t->n : 1);
  return DT_OK;
}

static dt_status shm_reduce_scatter(dt_transport *t, const void *sbuf, void *rbuf, size_t count, dt_dtype dt, dt_op op,
                                    const dt__fp *fp, int64_t deadline) {
  size_t es = dt_dtype_size(dt);
  const uint8_t *in = sbuf == DT_IN_PLACE ? rbuf : sbuf;
  if (t->n == 1) {
    if (in != (uint8_t *)rbuf && count)
      memmove(rbuf, in, count * es);
    dt__reduce_finish(rbuf, count, dt, op, 1);
    return DT_OK;
  }
  shm_phase p = {.in = in, .out = rbuf, .count = count, .es = es, .dt = dt, .op = op};
  p.per = (t->h->chunk_bytes / (size_t)t->n) / SHM_LINE * SHM_LINE / es;
  if (!p.per)
    return dt_set_error(DT_ERR_INVALID, "DTRAIN_SHM_CHUNK %llu is too small for %d ranks",
                        (unsigned long long)t->h->chunk_bytes, t->n);
  size_t nchunks = count ? (count + p.per - 1) / p.per : 1;
  return shm_two_phase(t, &p, nchunks, rs_fill, rs_consume, fp, deadline);
}

/* Flat broadcast, allgather and reduce_scatter for small buffers: the flat allreduce's rounds,
 * each carrying one piece (up to flat_bytes per slot) of what the others need from this rank:
 *   broadcast: the root's piece; the others post an empty slot, so every rank still sees every
 *     rank's call and a mismatch is reported everywhere (not only where the data goes);
 *   allgather: this rank's piece of its block (its own block goes to its output meanwhile);
 *   reduce_scatter: the same piece of every block but its own (block s at s * per in the slot);
 *     rank r reduces block r from the slots and its own input, in rank order;
 *   barrier (count 0): an empty slot from every rank (shm_barrier).
 * One wait per round where the two-phase frame below waits twice (everyone's fill, then
 * everyone's consumption two chunks later). */
static dt_status shm_flat_move(dt_transport *t, dt__coll kind, const void *sbuf, void *rbuf, size_t count,
                               dt_dtype dt, dt_op op, int root, const dt__fp *fp, int64_t deadline) {
  DT_CHECK(shm_usable(t));
  const size_t es = dt_dtype_size(dt), blk = count * es;
  const int n = t->n, me = t->rank;
  uint8_t *out = rbuf;
  const uint8_t *in = kind == DT_COLL_BROADCAST ? out
                      : sbuf != DT_IN_PLACE     ? sbuf
                      : kind == DT_COLL_ALLGATHER ? out + (size_t)me * blk
                                                  : out;
  size_t per = t->h->flat_bytes / es; /* elements per block per round */
  /* a slot too small for an element of every block (DTRAIN_SHM_FLAT 64 and many ranks): every
   * rank sees the same header, so all take the staged path */
  if (kind == DT_COLL_REDUCE_SCATTER && !(per = t->h->flat_bytes / (size_t)n / es))
    return shm_reduce_scatter(t, sbuf, rbuf, count, dt, op, fp, deadline ? deadline : dt__comm_deadline(t->c));
  if (kind == DT_COLL_ALLGATHER && in != out + (size_t)me * blk && blk)
    dt__copy(out + (size_t)me * blk, in, blk);
  uint64_t mine[3];
  memcpy(mine, fp, sizeof mine);
  const size_t npieces = count ? (count + per - 1) / per : 1;
  dt_status st = DT_OK;
  for (size_t k = 0; k < npieces; k++) {
    uint64_t g = ++t->flats;
    int p = (int)(g & 1);
    const size_t m = count ? DT_MIN(per, count - k * per) : 0, off = k * per * es;
    if (kind == DT_COLL_REDUCE_SCATTER) {
      shm_flat *own = shm_flat_open(t, g, mine);
      for (int s = 0; s < n && m; s++)
        if (s != me)
          dt__copy(own->data + (size_t)s * per * es, in + (size_t)s * blk + off, m * es);
      shm_flat_close(t, own, g);
    } else {
      bool sends = kind == DT_COLL_ALLGATHER || me == root;
      /* no pointer arithmetic on an empty call's buffers: a barrier's are NULL */
      shm_flat_post(t, g, mine, m ? in + off : NULL, sends ? m * es : 0);
    }
    DT_CHECK_GOTO(shm_flat_wait_all(t, g, mine, fp, &deadline), st, fail);
    if (!m)
      continue;
    if (kind == DT_COLL_BROADCAST) {
      if (me != root)
        dt__copy(out + off, shm_flat_of(t, root, p)->data, m * es);
    } else if (kind == DT_COLL_ALLGATHER) {
      for (int r = 0; r < n; r++)
        if (r != me)
          dt__copy(out + (size_t)r * blk + off, shm_flat_of(t, r, p)->data, m * es);
    } else {
      for (int s = 0; s < n; s++)
        t->srcs[s] = s == me ? in + (size_t)me * blk + off : shm_flat_of(t, s, p)->data + (size_t)me * per * es;
      dt__reduce_many(out + off, t->srcs, n, m, dt, op, op == DT_AVG ? n : 1);
    }
  }
  return DT_OK;
fail:
  t->broken = true;
  return st;
}

/* The transport's one-round path (ops->flat). */
static dt_status shm_flat_coll(dt_transport *t, dt__coll kind, const void *sbuf, void *rbuf, size_t count, dt_dtype dt,
                          dt_op op, int root, const dt__fp *fp, int64_t deadline) {
  if (kind == DT_COLL_ALLREDUCE)
    return shm_allreduce_flat(t, sbuf, rbuf, count, dt, op, fp, deadline);
  return shm_flat_move(t, kind, sbuf, rbuf, count, dt, op, root, fp, deadline);
}

/* A flat round that carries no data (shm_flat_move with nothing to move): each rank publishes
 * its slot (the round number and the call's fingerprint on one line) and waits for every other
 * rank's. The barrier before it kept a counter and a fingerprint on lines of their own and wrote
 * the call board first; the rank the last arrival released left one handoff later there
 * (docs/BENCHMARKS-LOG.md, "Ranks that mpirun binds, and the barrier"). */
static dt_status shm_barrier(dt_transport *t, const dt__fp *fp, int64_t deadline) {
  if (t->n == 1)
    return DT_OK;
  return shm_flat_move(t, DT_COLL_BARRIER, NULL, NULL, 0, DT_U8, 0, 0, fp, deadline);
}

/* ---- the shared window (dt_comm_window) ---- */

static uint8_t *shm_win(dt_transport *t, int r) { return t->win_base + (size_t)r * t->win_stride; }
static void *shm_window_part(dt_transport *t, int r) { return shm_win(t, r); }

/* Rank 0 creates one object holding every rank's part and publishes "name bytes" (or "!why");
 * each other rank maps it and answers "1" (or "0why"); rank 0 unlinks it and publishes the
 * verdict ("1", or "0" and the first rank's reason, or "p" and the job's failure when a rank
 * died or the job failed meanwhile), which every rank returns (DT_ERR_PEER for "p"). */
static dt_status shm_window(dt_transport *t, size_t bytes, void **out, int64_t deadline) {
  dt_comm *c = t->c;
  size_t stride = shm_align(bytes, 4096), size = stride * (size_t)t->n, len = 0;
  char key[128], vkey[128], val[512], name[200] = "";
  void *p = MAP_FAILED;
  dt_status st = DT_OK;
  /* keys of their own per attempt: a failed attempt's answers must not be read by the next */
  unsigned n_try = ++t->win_tries;
  dt__comm_key(c, key, sizeof key, "shm/win/%u", n_try);
  dt__comm_key(c, vkey, sizeof vkey, "shm/win/%u/verdict", n_try);
  if (t->rank == 0) {
    uint8_t r[6];
    char nonce[24];
    st = dt__random_bytes(r, sizeof r);
    if (st == DT_OK) {
      snprintf(nonce, sizeof nonce, "w%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5]);
      shm_name(c, nonce, name, sizeof name);
      st = shm_alloc(name, size, &p);
    }
    if (st != DT_OK) { /* the others learn why, and so does our caller */
      char why[400];
      snprintf(why, sizeof why, "%s", dt_last_error());
      snprintf(val, sizeof val, "!%s", why);
      dt__store_set(c->store, key, val, strlen(val), deadline);
      return dt_set_error(st, "%s", why);
    }
    snprintf(val, sizeof val, "%s %zu", name, bytes);
    dt_status sst = dt__store_set(c->store, key, val, strlen(val), deadline);
    if (sst != DT_OK) {
      shm_unlink(name);
      munmap(p, size);
      return dt__error_prefix(sst, "publishing the shared window");
    }
    char verdict[512] = "1";
    dt_status wst = DT_OK; /* the job failed (or the deadline passed) while rank 0 waited */
    for (int q = 1; q < t->n; q++) {
      char k2[128], v[400];
      dt__comm_key(c, k2, sizeof k2, "shm/win/%u/mapped/%d", n_try, q);
      wst = dt__store_wait(c->store, k2, v, sizeof v - 1, &len, deadline);
      if (wst != DT_OK) {
        /* not "rank q did not answer": the job's failure (a rank killed, an abort) names its
         * cause, which need not be rank q */
        dt__error_prefix(wst, "while rank 0 waited for rank %d to map the shared window", q);
        snprintf(verdict, sizeof verdict, "p%s", dt_last_error());
        break;
      }
      v[len] = '\0';
      if (v[0] == 'm' && verdict[0] == '1') /* a different size: the answer names both */
        snprintf(verdict, sizeof verdict, "%s", v);
      else if (v[0] != '1' && verdict[0] == '1')
        snprintf(verdict, sizeof verdict, "0rank %d: %s", q, v + 1);
    }
    shm_unlink(name);
    dt_status vst = dt__store_set(c->store, vkey, verdict, strlen(verdict), deadline);
    if (verdict[0] != '1' || vst != DT_OK) {
      munmap(p, size);
      if (wst != DT_OK)
        return dt_set_error(wst, "shared window of %zu bytes per rank: %s", bytes, verdict + 1);
      if (verdict[0] != '1')
        return dt_set_error(verdict[0] == 'm' ? DT_ERR_MISMATCH : DT_ERR_SYSTEM, "shared window of %zu bytes per rank: %s",
                            bytes, verdict + 1);
      return dt__error_prefix(vst, "publishing the shared window's verdict");
    }
  } else {
    st = dt__store_wait(c->store, key, val, sizeof val - 1, &len, deadline);
    if (st != DT_OK)
      return dt__error_prefix(st, "waiting for rank 0 to create the shared window");
    val[len] = '\0';
    if (val[0] == '!')
      return dt_set_error(DT_ERR_SYSTEM, "rank 0 could not create the shared window: %s", val + 1);
    char k2[128], ans[400] = "1";
    size_t theirs = 0;
    if (sscanf(val, "%199s %zu", name, &theirs) != 2) {
      snprintf(ans, sizeof ans, "0rank %d could not read the window's name", t->rank);
    } else if (theirs != bytes) {
      snprintf(ans, sizeof ans, "mrank %d asked for %zu bytes per rank, rank 0 for %zu", t->rank, bytes, theirs);
    } else {
      size_t got = 0;
      if (shm_attach(name, size, &p, &got) != DT_OK) {
        snprintf(ans, sizeof ans, "0rank %d: %s", t->rank, dt_last_error());
        p = MAP_FAILED;
      } else if (got != size) {
        snprintf(ans, sizeof ans, "0rank %d: %s holds %zu bytes, not %zu", t->rank, name, got, size);
        munmap(p, got);
        p = MAP_FAILED;
      }
    }
    dt__comm_key(c, k2, sizeof k2, "shm/win/%u/mapped/%d", n_try, t->rank);
    st = dt__store_set(c->store, k2, ans, strlen(ans), deadline);
    if (st == DT_OK)
      st = dt__store_wait(c->store, vkey, val, sizeof val - 1, &len, deadline);
    if (st != DT_OK || len == 0 || val[0] != '1') {
      if (p != MAP_FAILED)
        munmap(p, size);
      if (st != DT_OK)
        return dt__error_prefix(st, "waiting for the shared window's verdict");
      val[len] = '\0';
      return dt_set_error(len && val[0] == 'm'   ? DT_ERR_MISMATCH
                          : len && val[0] == 'p' ? DT_ERR_PEER
                                                 : DT_ERR_SYSTEM,
                          "shared window of %zu bytes per rank: %s", bytes, len ? val + 1 : "?");
    }
  }
  t->win_base = p;
  t->win_size = size;
  t->win_stride = stride;
  *out = shm_win(t, t->rank);
  return DT_OK;
}

/* Elements per piece of a window reduction: the reduced piece is still in L1/L2 when it is
 * copied into the other ranks' windows. */
#define SHM_WIN_PIECE (32u << 10)

/* Reduces elements [lo, hi) (offsets into every window) from every rank's window, its own
 * first (dt__reduce_many writes its output while reading operands 2..), into its own window in
 * place, and, when spread, copies each reduced piece into the others' windows while it is warm. */
static void shm_win_reduce(dt_transport *t, size_t lo, size_t hi, size_t es, dt_dtype dt, dt_op op, bool spread) {
  const size_t per = DT_MAX((size_t)1, SHM_WIN_PIECE / es);
  for (size_t a = lo; a < hi; a += per) {
    size_t m = DT_MIN(per, hi - a), at = a * es;
    uint8_t *mine = shm_win(t, t->rank) + at;
    int k = 0;
    t->srcs[k++] = mine;
    for (int r = 0; r < t->n; r++)
      if (r != t->rank)
        t->srcs[k++] = shm_win(t, r) + at;
    dt__reduce_many(mine, t->srcs, t->n, m, dt, op, op == DT_AVG ? t->n : 1);
    for (int r = 0; spread && r < t->n; r++)
      if (r != t->rank)
        memcpy(shm_win(t, r) + at, mine, m * es);
  }
}

/* Allreduce, reduce_scatter or allgather in place in the windows, starting at element off.
 * Every rank publishes that its part is in place (win_in = g) and waits for all; then
 *   - allreduce (count elements): reduces its line-aligned slice of the range and copies the
 *     result into every other window;
 *   - reduce_scatter (count per block, block r at off + r * count): reduces its own block into
 *     its own window, where no other rank reads;
 *   - allgather: copies its own block into every other window at the same place;
 * then publishes win_out = g and waits until every rank did. Only then is a reduce_scatter's
 * block moved to the range's start (the public layout), where other ranks were reading. Between
 * win_in and win_out other ranks read and write the call's range of this rank's window, never
 * the rest; a rank enters call g + 1 only after every rank's win_out = g. Each element is
 * reduced once, so every rank ends with the same bits. Per rank, an allreduce reads the range
 * once and writes it once (2 x count elements of traffic). */
static dt_status shm_coll_window(dt_transport *t, dt__coll kind, size_t off, size_t count, dt_dtype dt, dt_op op,
                                 const dt__fp *fp, int64_t deadline) {
  size_t es = dt_dtype_size(dt), span = kind == DT_COLL_ALLREDUCE ? count : count * (size_t)t->n;
  if (!t->win_base || (off + span) * es > t->win_stride)
    return dt_set_error(DT_ERR_STATE, "rank %d: window call on elements %zu..%zu outside the window", t->rank, off,
                        off + span);
  bool done;
  dt_status st = shm_allreduce_prelude(t, NULL, NULL, 0, dt, op, &done);
  if (st != DT_OK || done)
    return st;
  shm_board_set(t, fp);
  uint64_t g = ++t->wins;
  t->ranks[t->rank].win_fp = *fp;
  shm_publish(t, offsetof(shm_rank, win_in), g);
  DT_CHECK_GOTO(shm_wait_all(t, offsetof(shm_rank, win_in), g, offsetof(shm_rank, win_fp), 0, fp, deadline), st,
                fail);
  size_t lo, hi, mine = off + (size_t)t->rank * count;
  if (kind == DT_COLL_ALLREDUCE) {
    shm_slice(count, es, t->n, t->rank, &lo, &hi);
    shm_win_reduce(t, off + lo, off + hi, es, dt, op, true);
  } else if (kind == DT_COLL_REDUCE_SCATTER) {
    shm_win_reduce(t, mine, mine + count, es, dt, op, false);
  } else {
    for (int r = 0; r < t->n; r++)
      if (r != t->rank)
        memcpy(shm_win(t, r) + mine * es, shm_win(t, t->rank) + mine * es, count * es);
  }
  shm_publish(t, offsetof(shm_rank, win_out), g);
  DT_CHECK_GOTO(shm_wait_all(t, offsetof(shm_rank, win_out), g, 0, 0, fp, deadline), st, fail);
  if (kind == DT_COLL_REDUCE_SCATTER && t->rank > 0)
    memcpy(shm_win(t, t->rank) + off * es, shm_win(t, t->rank) + mine * es, count * es);
  return DT_OK;
fail:
  t->broken = true;
  return st;
}

/* A message takes whole slots of the ring to its peer (an empty one, one slot). */
static size_t shm_queue_msgs(dt_transport *t, size_t bytes) {
  size_t per = bytes ? (bytes + t->h->slot_bytes - 1) / t->h->slot_bytes : 1;
  return t->h->nslots / per;
}

const dt_transport_ops dt__transport_shm = {
    .name = "shm",
    .create = shm_create,
    .sendrecv = shm_sendrecv,
    .queue_msgs = shm_queue_msgs,
    .allreduce = shm_allreduce,
    .flat = shm_flat_coll,
    .broadcast = shm_broadcast,
    .allgather = shm_allgather,
    .reduce_scatter = shm_reduce_scatter,
    .barrier = shm_barrier,
    .single_copy = shm_single_copy,
    .window = shm_window,
    .window_part = shm_window_part,
    .coll_window = shm_coll_window,
    .destroy = shm_destroy,
};
