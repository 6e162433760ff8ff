/* test_inspect.c - `dtrain inspect` on real files written here: a checkpoint, a safetensors model
 * and an IDX file are described (sections, tensors, meta, dims); a corrupt checkpoint, a torn
 * safetensors file, an unknown format and a missing file exit 1 naming the file and the problem;
 * bad usage exits 2. Runs the real binary (DTRAIN_BIN). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/ckpt.h"

static char tmpdir[256];
static char out[65536];

/* Runs `dtrain inspect ARGS` with stdout+stderr captured into out; returns the exit code. */
static int run(const char *args) {
  const char *bin = getenv("DTRAIN_BIN");
  assert_non_null(bin);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "timeout 60 '%s' inspect %s 2>&1", bin, args); /* 124: it hung */
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  assert_true(WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void expect_out(const char *s) {
  if (!strstr(out, s))
    fail_msg("output lacks '%s':\n%s", s, out);
}

static void test_inspect(void **st) {
  char ck[400], sf[400], idx[400], args[1300];
  snprintf(ck, sizeof ck, "%s/ckpt-000000007.dtc", tmpdir);
  snprintf(sf, sizeof sf, "%s/model.safetensors", tmpdir);
  snprintf(idx, sizeof idx, "%s/labels-idx1-ubyte", tmpdir);
  float w[6] = {1, 2, 3, 4, 5, 6};
  dt_ckpt_section secs[2] = {{"params", w, sizeof w, 0}, {"opt.m", w, 8, 0}};
  dt_kv meta[2] = {{"step", "7"}, {"model", "mlp"}};
  assert_int_equal(dt_ckpt_write(ck, 7, secs, 2, meta, 2), DT_OK);
  dt_tensor_view t = {.name = "fc.weight", .dtype = DT_ST_F32, .ndim = 2, .shape = {2, 3},
                      .data = w, .nbytes = 24};
  dt_kv fm = {"format", "pt"};
  assert_int_equal(dt_safetensors_write(sf, &t, 1, &fm, 1), DT_OK);
  FILE *f = fopen(idx, "wb");
  fwrite("\0\0\x08\x01\0\0\0\x03\x01\x02\x03", 1, 11, f);
  fclose(f);

  snprintf(args, sizeof args, "'%s'", ck);
  assert_int_equal(run(args), 0);
  expect_out("dtrain checkpoint v1, step 7, 2 sections");
  expect_out("all CRC32C verified");
  expect_out("params");
  expect_out("24 bytes");
  expect_out("opt.m");
  expect_out("step = 7");
  expect_out("model = mlp");
  snprintf(args, sizeof args, "'%s' '%s'", sf, idx);
  assert_int_equal(run(args), 0);
  expect_out("safetensors, header");
  expect_out("1 tensors, 6 elements, 24 data bytes, valid");
  expect_out("fc.weight");
  expect_out("F32");
  expect_out("[2, 3]");
  expect_out("format = pt");
  expect_out("IDX, u8, 1 dimensions [3], 3 elements, valid");
  expect_out("valid; 0 values not finite");
  /* NaN and infinite values: still valid (the file is what was written), but counted */
  char sfn[400];
  snprintf(sfn, sizeof sfn, "%s/nan.safetensors", tmpdir);
  float wn[6] = {1, NAN, 3, INFINITY, 5, -INFINITY};
  dt_tensor_view tn = t;
  tn.data = wn;
  assert_int_equal(dt_safetensors_write(sfn, &tn, 1, NULL, 0), DT_OK);
  snprintf(args, sizeof args, "'%s'", sfn);
  assert_int_equal(run(args), 0);
  expect_out("valid; 3 values not finite (NaN or infinity)");
  /* half types too (F16 Inf and NaN, BF16 NaN and -Inf), and a newline in metadata or a name
   * prints as \x0a instead of a line of its own */
  uint16_t h16[4] = {0x3c00, 0x7c00, 0x7e00, 0x0000}, b16[4] = {0x3f80, 0x7fc0, 0xff80, 0x4000};
  uint8_t f8[4] = {0x7c, 0x3c, 0x7f, 0x38}; /* E5M2 infinity, one; E4M3 NaN, one */
  dt_tensor_view th[4] = {{.name = "a\nb", .dtype = DT_ST_F16, .ndim = 1, .shape = {4}, .data = h16, .nbytes = 8},
                          {.name = "c", .dtype = DT_ST_BF16, .ndim = 1, .shape = {4}, .data = b16, .nbytes = 8},
                          {.name = "e5", .dtype = DT_ST_F8_E5M2, .ndim = 1, .shape = {2}, .data = f8, .nbytes = 2},
                          {.name = "e4", .dtype = DT_ST_F8_E4M3, .ndim = 1, .shape = {2}, .data = f8 + 2, .nbytes = 2}};
  dt_kv hm = {"note", "x\nfake.safetensors: safetensors, valid"};
  assert_int_equal(dt_safetensors_write(sfn, th, 4, &hm, 1), DT_OK);
  assert_int_equal(run(args), 0);
  expect_out("valid; 6 values not finite (NaN or infinity)");
  expect_out("note = x\\x0afake.safetensors");
  expect_out("a\\x0ab");
  if (strstr(out, "\nfake.safetensors"))
    fail_msg("a metadata newline printed as a line:\n%s", out);
  /* a file whose name starts with '-': after "--" it is a file, without it an unknown flag */
  {
    char here[1024], dash[600];
    assert_non_null(getcwd(here, sizeof here));
    snprintf(dash, sizeof dash, "%s/-dash.safetensors", tmpdir);
    assert_int_equal(dt_safetensors_write(dash, &t, 1, &fm, 1), DT_OK);
    assert_int_equal(chdir(tmpdir), 0);
    int rc1 = run("-- -dash.safetensors");
    static char first[sizeof out];
    memcpy(first, out, sizeof out);
    int rc2 = run("-dash.safetensors");
    assert_int_equal(chdir(here), 0);
    unlink(dash);
    if (rc1 != 0 || !strstr(first, "-dash.safetensors: safetensors"))
      fail_msg("inspect -- -dash.safetensors: exit %d: %s", rc1, first);
    if (rc2 != 2 || !strstr(out, "unknown flag '-dash.safetensors'"))
      fail_msg("inspect -dash.safetensors: exit %d: %s", rc2, out);
  }

  /* A directory: every checkpoint listed. */
  char ck2[400];
  snprintf(ck2, sizeof ck2, "%s/ckpt-000000009.dtc", tmpdir);
  assert_int_equal(dt_ckpt_write(ck2, 9, secs, 2, meta, 2), DT_OK);
  /* a write that never finished (its writer gone): said, and removed */
  char stray[400];
  pid_t gone = fork();
  if (gone == 0)
    _exit(0);
  waitpid(gone, NULL, 0);
  snprintf(stray, sizeof stray, "%s/.ckpt-000000011.dtc.tmp.%ld", tmpdir, (long)gone);
  FILE *sf2 = fopen(stray, "w");
  assert_non_null(sf2);
  fputs("half a checkpoint", sf2);
  fclose(sf2);
  /* a name like a checkpoint's that no resume reads: mentioned, not silently passed over */
  char odd[400];
  snprintf(odd, sizeof odd, "%s/ckpt-x.dtc", tmpdir);
  sf2 = fopen(odd, "w");
  assert_non_null(sf2);
  fclose(sf2);
  snprintf(args, sizeof args, "'%s'", tmpdir);
  assert_int_equal(run(args), 0);
  expect_out("2 checkpoint files");
  expect_out("a resume would use step 9");
  expect_out("a checkpoint write that never finished");
  expect_out("ignored           ckpt-x.dtc (not ckpt-<step>.dtc");
  assert_int_not_equal(access(stray, F_OK), 0);
  unlink(odd);
  /* The newest corrupted (torn): reported, and the resume falls back to step 7. */
  assert_int_equal(truncate(ck2, 100), 0);
  assert_int_equal(run(args), 1);
  expect_out("CORRUPT");
  expect_out("truncated or torn write");
  expect_out("a resume would use step 7");

  /* Corrupt checkpoint: one flipped data byte. */
  f = fopen(ck, "r+b");
  fseek(f, 384 + 4, SEEK_SET); /* inside "params": header 64 + table 3 x 96, aligned to 64 */
  int c = fgetc(f);
  fseek(f, 384 + 4, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
  snprintf(args, sizeof args, "'%s'", ck);
  assert_int_equal(run(args), 1);
  expect_out("ckpt-000000007.dtc: section \"params\"");
  expect_out("CRC32C");
  /* Torn safetensors. */
  assert_int_equal(truncate(sf, 30), 0);
  snprintf(args, sizeof args, "'%s'", sf);
  assert_int_equal(run(args), 1);
  expect_out("model.safetensors");
  /* Unknown, empty and missing files; usage errors. */
  char junk[400];
  snprintf(junk, sizeof junk, "%s/junk.bin", tmpdir);
  f = fopen(junk, "wb");
  fputs("#!/bin/sh\necho hi\n", f);
  fclose(f);
  snprintf(args, sizeof args, "'%s'", junk);
  assert_int_equal(run(args), 1);
  expect_out("unknown format");
  snprintf(args, sizeof args, "'%s/missing.dtc'", tmpdir);
  assert_int_equal(run(args), 1);
  expect_out("dtrain inspect: ");
  expect_out("missing.dtc: No such file or directory");
  /* A model file naming a dtrain model its tensors do not match: the file is sound, the model
   * does not load (as eval would find). */
  char mf[400];
  snprintf(mf, sizeof mf, "%s/other.safetensors", tmpdir);
  dt_kv mm[2] = {{"format", "pt"}, {"dtrain.model_spec", "in=3,linear:2"}};
  assert_int_equal(dt_safetensors_write(mf, &t, 1, mm, 2), DT_OK);
  snprintf(args, sizeof args, "'%s'", mf);
  assert_int_equal(run(args), 1);
  expect_out("valid");
  expect_out("does not load as the dtrain model it names");
  /* A FIFO (alone, and as a checkpoint in a directory) is refused, not waited on for a writer. */
  char fifo[512], fdir[400];
  snprintf(fifo, sizeof fifo, "%s/pipe.dtc", tmpdir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  snprintf(args, sizeof args, "'%s'", fifo);
  assert_int_equal(run(args), 1);
  expect_out("pipe.dtc: not a regular file");
  snprintf(fdir, sizeof fdir, "%s/fifodir", tmpdir);
  assert_int_equal(mkdir(fdir, 0700), 0);
  snprintf(fifo, sizeof fifo, "%s/ckpt-000000003.dtc", fdir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  snprintf(args, sizeof args, "'%s'", fdir);
  assert_int_equal(run(args), 1);
  expect_out("not a regular file");
  expect_out("no valid checkpoint");
  assert_int_equal(run(""), 2);
  expect_out("no file given");
  expect_out("---> HINT");
  assert_int_equal(run("--bogus x"), 2);
  assert_int_equal(run("--help"), 0);
  expect_out("usage: dtrain inspect");
}

static int setup(void **st) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_test_inspect_XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **st) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_inspect)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
