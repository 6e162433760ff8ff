/* test_ckpt.c - the checkpoint format and its directory handling: round trip, a bit flip in each
 * part of the newest file detected and the previous one used, truncated / zero-length / torn
 * files, stray temp files of dead writers cleaned (a live writer's kept), keep-last-K pruning,
 * a file whose name and stored step differ (invalid, named as found),
 * and a write that fails half way (file size limit, and a really full file system when the test
 * may mount one) leaving the previous checkpoint loadable and no temp file behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/ckpt.h"

static char tmpdir[256];

static const char *tpath(const char *name) {
  static char p[4][512];
  static int k;
  k = (k + 1) % 4;
  snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
  return p[k];
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  assert_int_equal(fread(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void spit(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* A training state: params (P floats), two Adam moments, RNG words, an empty section. */
enum { P = 3001 };
static float params[P], m1[P], m2[P];
static uint64_t rngw[4] = {1, 2, 3, 0xdeadbeefcafef00dull};

static void fill_state(uint64_t step) {
  for (int i = 0; i < P; i++) {
    params[i] = (float)i * 0.001f + (float)step;
    m1[i] = -(float)i;
    m2[i] = (float)(i % 7) + 0.5f;
  }
  rngw[0] = step;
}

static dt_status save(const char *dir, uint64_t step, int keep) {
  fill_state(step);
  dt_ckpt_section s[5] = {
      {"params", params, sizeof params, 0}, {"opt.m", m1, sizeof m1, 0}, {"opt.v", m2, sizeof m2, 0},
      {"rng", rngw, sizeof rngw, 0},        {"empty", NULL, 0, 0},
  };
  char stepbuf[32];
  snprintf(stepbuf, sizeof stepbuf, "%llu", (unsigned long long)step);
  dt_kv meta[4] = {{"step", stepbuf}, {"epoch", "2"}, {"model", "mlp:784-1024-10 \"x\"\n"},
                   {"empty", ""}};
  return dt_ckpt_save(dir, step, s, 5, meta, 4, keep, NULL, 0);
}

static void check_state(const dt_ckpt *c, uint64_t step) {
  fill_state(step);
  assert_int_equal(dt_ckpt_step(c), step);
  assert_int_equal(dt_ckpt_count(c), 5);
  const dt_ckpt_section *s = dt_ckpt_find(c, "params");
  assert_non_null(s);
  assert_int_equal(s->nbytes, sizeof params);
  assert_memory_equal(s->data, params, sizeof params);
  assert_int_equal((uintptr_t)s->data % 64, 0); /* sections are 64-byte aligned in memory */
  assert_memory_equal(dt_ckpt_find(c, "opt.m")->data, m1, sizeof m1);
  assert_memory_equal(dt_ckpt_find(c, "opt.v")->data, m2, sizeof m2);
  assert_memory_equal(dt_ckpt_find(c, "rng")->data, rngw, sizeof rngw);
  assert_int_equal(dt_ckpt_find(c, "empty")->nbytes, 0);
  assert_null(dt_ckpt_find(c, "meta")); /* meta is exposed as key/values, not a section */
  assert_string_equal(dt_ckpt_section_at(c, 0)->name, "params");
  uint64_t v;
  assert_int_equal(dt_ckpt_meta_u64(c, "step", &v), DT_OK);
  assert_int_equal(v, step);
  assert_string_equal(dt_ckpt_meta_get(c, "model"), "mlp:784-1024-10 \"x\"\n");
  assert_string_equal(dt_ckpt_meta_get(c, "empty"), "");
  assert_int_equal(dt_ckpt_meta_count(c), 4);
  assert_int_equal(dt_ckpt_meta_u64(c, "model", &v), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "meta \"model\""));
  assert_int_equal(dt_ckpt_meta_u64(c, "nope", &v), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "no meta key \"nope\""));
}

static void fresh_dir(const char *name, char *dir, size_t cap) {
  snprintf(dir, cap, "%s/%s", tmpdir, name);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

static void test_round_trip(void **st) {
  char dir[400];
  fresh_dir("rt", dir, sizeof dir);
  assert_int_equal(save(dir, 1200, 0), DT_OK);
  dt_ckpt *c;
  char p[512];
  snprintf(p, sizeof p, "%s/ckpt-000001200.dtc", dir);
  assert_int_equal(dt_ckpt_open(p, &c), DT_OK);
  check_state(c, 1200);
  assert_string_equal(dt_ckpt_path(c), p);
  assert_string_equal(dt_ckpt_skipped(c), "");
  assert_int_equal(dt_ckpt_version(c), 1);
  dt_ckpt_destroy(c);
  dt_ckpt_destroy(NULL);
  /* Header bytes as documented: magic, version, step, file size. */
  size_t n;
  unsigned char *b = slurp(p, &n);
  assert_memory_equal(b, "DTRCKPT\n", 8);
  assert_int_equal(b[8], 1);
  uint64_t stepf = 0, size = 0;
  memcpy(&stepf, b + 16, 8);
  memcpy(&size, b + 24, 8);
  assert_int_equal(stepf, 1200);
  assert_int_equal(size, n);
  free(b);
  /* Saving the same step again replaces it atomically. */
  assert_int_equal(save(dir, 1200, 0), DT_OK);
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
  check_state(c, 1200);
  dt_ckpt_destroy(c);
  /* Bad inputs to the writer. */
  dt_ckpt_section bad[2] = {{"meta", params, 4, 0}, {"x", NULL, 4, 0}};
  assert_int_equal(dt_ckpt_write(tpath("bad.dtc"), 1, bad, 1, NULL, 0), DT_ERR_INVALID);
  assert_int_equal(dt_ckpt_write(tpath("bad.dtc"), 1, bad + 1, 1, NULL, 0), DT_ERR_INVALID);
  dt_ckpt_section dup[2] = {{"a", params, 4, 0}, {"a", params, 4, 0}};
  assert_int_equal(dt_ckpt_write(tpath("bad.dtc"), 1, dup, 2, NULL, 0), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "duplicate section \"a\""));
  assert_int_equal(access(tpath("bad.dtc"), F_OK), -1);
}

static void test_keep_last(void **st) {
  char dir[400];
  fresh_dir("keep", dir, sizeof dir);
  for (uint64_t s = 100; s <= 700; s += 100)
    assert_int_equal(save(dir, s, 3), DT_OK);
  uint64_t *steps;
  size_t n;
  assert_int_equal(dt_ckpt_list(dir, &steps, &n), DT_OK);
  assert_int_equal(n, 3);
  assert_int_equal(steps[0], 500);
  assert_int_equal(steps[1], 600);
  assert_int_equal(steps[2], 700);
  free(steps);
  /* Saving an older step (a resumed run) never deletes the file just written. */
  assert_int_equal(save(dir, 50, 2), DT_OK);
  assert_int_equal(dt_ckpt_list(dir, &steps, &n), DT_OK);
  assert_int_equal(n, 3);
  assert_int_equal(steps[0], 50);
  assert_int_equal(steps[1], 600);
  assert_int_equal(steps[2], 700);
  free(steps);
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
  check_state(c, 700);
  dt_ckpt_destroy(c);
  /* Unrelated files are left alone; an empty or missing directory is NOT_FOUND. */
  spit(tpath("keep/notes.txt"), "hi", 2);
  fresh_dir("emptydir", dir, sizeof dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "no checkpoint"));
  assert_int_equal(dt_ckpt_open_latest(tpath("nodir"), &c), DT_ERR_NOT_FOUND);
  assert_null(c);
}

/* A file's name and the step inside are compared: a step-100 file copied to step 500's name is
 * invalid (naming both) and skipped; an unpadded name (ckpt-700.dtc) is reported as it is. */
static void test_name_and_step(void **st) {
  char dir[400], p[512], q[512];
  fresh_dir("names", dir, sizeof dir);
  assert_int_equal(save(dir, 100, 0), DT_OK);
  assert_int_equal(save(dir, 200, 0), DT_OK);
  size_t n;
  snprintf(p, sizeof p, "%s/ckpt-000000100.dtc", dir);
  unsigned char *b = slurp(p, &n);
  snprintf(q, sizeof q, "%s/ckpt-000000500.dtc", dir);
  spit(q, b, n);
  free(b);
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open(q, &c), DT_ERR_CORRUPT);
  assert_null(c);
  assert_non_null(strstr(dt_last_error(), "ckpt-000000500.dtc: holds step 100, but its name says step 500"));
  snprintf(q, sizeof q, "%s/ckpt-700.dtc", dir);
  spit(q, "not a checkpoint", 16);
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
  check_state(c, 200);
  assert_non_null(strstr(dt_ckpt_skipped(c), q));
  assert_non_null(strstr(dt_ckpt_skipped(c), "holds step 100, but its name says step 500"));
  assert_null(strstr(dt_ckpt_skipped(c), "ckpt-000000700.dtc"));
  dt_ckpt_destroy(c);
  char **paths;
  assert_int_equal(dt_ckpt_list_paths(dir, &paths, &n), DT_OK);
  assert_int_equal(n, 4);
  assert_string_equal(paths[3], q);
  snprintf(p, sizeof p, "%s/ckpt-000000200.dtc", dir);
  assert_string_equal(paths[1], p);
  free(paths);
  /* pruning removes files by their real names too (keeping the highest step and the new one) */
  assert_int_equal(save(dir, 300, 1), DT_OK);
  assert_int_equal(dt_ckpt_list_paths(dir, &paths, &n), DT_OK);
  assert_int_equal(n, 2);
  assert_string_equal(paths[1], q);
  free(paths);
}

/* Offsets of the parts of a file: header, table, and each section's data (from the table). */
typedef struct part {
  char name[64];
  uint64_t off, len;
} part;

static int parts_of(const unsigned char *b, part *ps) {
  uint32_t ns;
  memcpy(&ns, b + 12, 4);
  int k = 0;
  snprintf(ps[k].name, sizeof ps[k].name, "header");
  ps[k].off = 0, ps[k++].len = 64;
  snprintf(ps[k].name, sizeof ps[k].name, "section table");
  ps[k].off = 64, ps[k++].len = 96ull * ns;
  for (uint32_t i = 0; i < ns; i++) {
    const unsigned char *e = b + 64 + 96 * i;
    snprintf(ps[k].name, sizeof ps[k].name, "section \"%s\"", (const char *)e);
    memcpy(&ps[k].off, e + 64, 8);
    memcpy(&ps[k].len, e + 72, 8);
    k++;
  }
  return k;
}

static void test_bit_flips_fall_back(void **st) {
  char dir[400], newest[512];
  fresh_dir("flip", dir, sizeof dir);
  assert_int_equal(save(dir, 10, 5), DT_OK);
  assert_int_equal(save(dir, 20, 5), DT_OK);
  snprintf(newest, sizeof newest, "%s/ckpt-000000020.dtc", dir);
  size_t n;
  unsigned char *good = slurp(newest, &n), *b = malloc(n);
  part ps[16];
  int np = parts_of(good, ps);
  assert_int_equal(np, 2 + 6);
  int checked = 0;
  for (int i = 0; i < np; i++) {
    if (!ps[i].len)
      continue; /* the empty section has no byte to flip */
    for (int where = 0; where < 3; where++) { /* first, middle and last byte of the part */
      uint64_t at = ps[i].off + (where == 0 ? 0 : where == 1 ? ps[i].len / 2 : ps[i].len - 1);
      memcpy(b, good, n);
      b[at] ^= 0x10;
      spit(newest, b, n);
      dt_ckpt *c;
      assert_int_equal(dt_ckpt_open(newest, &c), DT_ERR_CORRUPT);
      assert_non_null(strstr(dt_last_error(), "ckpt-000000020.dtc"));
      if (i >= 2 && !strstr(dt_last_error(), ps[i].name))
        fail_msg("flip in %s at %llu: '%s' does not name it", ps[i].name, (unsigned long long)at,
                 dt_last_error());
      assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
      check_state(c, 10); /* fell back to the previous checkpoint */
      assert_non_null(strstr(dt_ckpt_skipped(c), "ckpt-000000020.dtc"));
      if (i >= 2)
        assert_non_null(strstr(dt_ckpt_skipped(c), ps[i].name));
      if (i >= 1 || where > 0) /* a flip in the magic is reported as a bad magic instead */
        assert_non_null(strstr(dt_ckpt_skipped(c), "CRC32C"));
      dt_ckpt_destroy(c);
      checked++;
    }
  }
  assert_int_equal(checked, 3 * 7);
  /* Both corrupt: an error listing both files. */
  memcpy(b, good, n);
  b[n / 2] ^= 1;
  spit(newest, b, n);
  char older[512];
  snprintf(older, sizeof older, "%s/ckpt-000000010.dtc", dir);
  spit(older, b, n / 3);
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_ERR_CORRUPT);
  assert_null(c);
  assert_non_null(strstr(dt_last_error(), "no valid checkpoint"));
  assert_non_null(strstr(dt_last_error(), "ckpt-000000020.dtc"));
  assert_non_null(strstr(dt_last_error(), "ckpt-000000010.dtc"));
  free(good);
  free(b);
}

static void test_truncated_and_empty(void **st) {
  char dir[400], newest[512];
  fresh_dir("trunc", dir, sizeof dir);
  assert_int_equal(save(dir, 1, 5), DT_OK);
  assert_int_equal(save(dir, 2, 5), DT_OK);
  snprintf(newest, sizeof newest, "%s/ckpt-000000002.dtc", dir);
  size_t n;
  unsigned char *good = slurp(newest, &n);
  const size_t cuts[] = {0, 7, 63, 64, 100, 64 + 96 * 6, n / 2, n - 64, n - 1};
  const char *msgs[] = {"empty file", "shorter than the 64-byte", "shorter than the 64-byte",
                        "truncated or torn", "truncated or torn", "truncated or torn",
                        "truncated or torn", "truncated or torn", "truncated or torn"};
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    spit(newest, good, cuts[i]);
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_open(newest, &c), DT_ERR_CORRUPT);
    if (!strstr(dt_last_error(), msgs[i]))
      fail_msg("cut at %zu: '%s' lacks '%s'", cuts[i], dt_last_error(), msgs[i]);
    assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
    check_state(c, 1);
    dt_ckpt_destroy(c);
  }
  /* Every other prefix too, through the in-memory parser: refused, never read past. */
  for (size_t k = 0; k < n; k += 37) {
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_parse(good, k, "prefix", &c), DT_ERR_CORRUPT);
  }
  /* Trailing bytes and a foreign file under a checkpoint name. */
  unsigned char *longer = malloc(n + 5);
  memcpy(longer, good, n);
  memset(longer + n, 0, 5);
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_parse(longer, n + 5, "long.dtc", &c), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "trailing bytes"));
  assert_int_equal(dt_ckpt_parse("hello world, not a checkpoint at all......................................",
                                 70, "text.dtc", &c), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "text.dtc: bad magic"));
  /* A newer version is reported as such (header CRC recomputed so only the version differs). */
  memcpy(longer, good, n);
  longer[8] = 2;
  assert_int_equal(dt_ckpt_parse(longer, n, "v2.dtc", &c), DT_ERR_CORRUPT); /* CRC catches it first */
  uint32_t hcrc = dt_crc32c(0, longer, 60);
  memcpy(longer + 60, &hcrc, 4);
  assert_int_equal(dt_ckpt_parse(longer, n, "v2.dtc", &c), DT_ERR_UNSUPPORTED);
  assert_non_null(strstr(dt_last_error(), "v2.dtc: checkpoint version 2 (this dtrain reads 1)"));
  /* The zero padding between sections is checked too. */
  memcpy(longer, good, n);
  longer[n - 1] = 0x20; /* the file ends in padding after "meta" (sizes are not multiples of 64) */
  assert_int_equal(dt_ckpt_parse(longer, n, "pad.dtc", &c), DT_ERR_CORRUPT);
  assert_non_null(strstr(dt_last_error(), "non-zero padding byte"));
  free(longer);
  free(good);
}

static void test_stray_temp_files(void **st) {
  char dir[400];
  fresh_dir("temp", dir, sizeof dir);
  assert_int_equal(save(dir, 5, 5), DT_OK);
  /* A dead writer's temp (a reaped child's pid) and a live one's (our parent's). */
  pid_t child = fork();
  if (child == 0)
    _exit(0);
  assert_int_equal(waitpid(child, NULL, 0), child);
  char dead[512], live[512];
  snprintf(dead, sizeof dead, "%s/.ckpt-000000009.dtc.tmp.%ld", dir, (long)child);
  snprintf(live, sizeof live, "%s/.ckpt-000000009.dtc.tmp.%ld", dir, (long)getppid());
  spit(dead, "DTRCKPT\npartial", 15);
  spit(live, "DTRCKPT\npartial", 15);
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
  check_state(c, 5);
  assert_string_equal(dt_ckpt_skipped(c), ""); /* temp files are not checkpoints */
  dt_ckpt_destroy(c);
  assert_int_equal(access(dead, F_OK), -1);    /* cleaned */
  assert_int_equal(access(live, F_OK), 0);     /* a live writer's file is not touched */
  unlink(live);
}

/* Child: writes a checkpoint too large for its limit; reports through the exit code. */
static int failing_write_child(const char *dir) {
  static float big[1 << 20]; /* 4 MiB */
  dt_ckpt_section s = {"params", big, sizeof big, 0};
  dt_status rc = dt_ckpt_save(dir, 99, &s, 1, NULL, 0, 5, NULL, 0);
  if (rc != DT_ERR_IO)
    return 10;
  if (!strstr(dt_last_error(), "ckpt-000000099.dtc"))
    return 11;
  if (!strstr(dt_last_error(), "File too large") && !strstr(dt_last_error(), "No space left"))
    return 12;
  return 0;
}

static void check_after_failed_write(const char *dir) {
  dt_ckpt *c;
  assert_int_equal(dt_ckpt_open_latest(dir, &c), DT_OK);
  check_state(c, 3);
  dt_ckpt_destroy(c);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q tmp", dir);
  assert_int_not_equal(system(cmd), 0); /* no temp file left behind */
}

static void test_write_failure_keeps_previous(void **st) {
  char dir[400];
  fresh_dir("efbig", dir, sizeof dir);
  assert_int_equal(save(dir, 3, 5), DT_OK);
  pid_t pid = fork();
  if (pid == 0) {
    /* A 1 MiB file size limit makes write(2) fail with EFBIG half way through. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &rl);
    _exit(failing_write_child(dir));
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  check_after_failed_write(dir);
}

static void test_enospc(void **st) {
  /* A real full file system: a 1 MiB tmpfs in a private mount namespace (needs root). */
  char dir[400];
  fresh_dir("enospc", dir, sizeof dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0)
      _exit(77);
    if (save(dir, 3, 5) != DT_OK)
      _exit(20);
    int rc = failing_write_child(dir);
    if (rc)
      _exit(rc);
    dt_ckpt *c;
    if (dt_ckpt_open_latest(dir, &c) != DT_OK || dt_ckpt_step(c) != 3)
      _exit(21);
    dt_ckpt_destroy(c);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -A '%s' | grep -q tmp", dir);
    _exit(system(cmd) == 0 ? 22 : 0);
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) {
    print_message("cannot mount a small tmpfs here (not root?): ENOSPC case skipped\n");
    skip();
  }
  assert_int_equal(WEXITSTATUS(status), 0);
}

static int setup(void **st) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_ckpt_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),         cmocka_unit_test(test_keep_last),
      cmocka_unit_test(test_bit_flips_fall_back), cmocka_unit_test(test_truncated_and_empty),
      cmocka_unit_test(test_stray_temp_files),   cmocka_unit_test(test_write_failure_keeps_previous),
      cmocka_unit_test(test_enospc),             cmocka_unit_test(test_name_and_step),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
