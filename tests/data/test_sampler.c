/* test_sampler.c - the distributed sampler: shards of each global batch are disjoint, contiguous
 * and cover it for every world size (including B not divisible by world and a short last batch);
 * every rank sees the same permutation; epochs differ; a saved state resumes exactly, also with
 * another world size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/data.h"

static dt_sampler_cfg cfg_of(uint64_t n, uint64_t b, int rank, int world, bool drop) {
  dt_sampler_cfg c = {.num_samples = n, .global_batch = b, .rank = rank, .world = world,
                      .seed = 42, .shuffle = true, .drop_last = drop};
  return c;
}

/* Draws one epoch of global batches on all ranks and checks shards against the 1-rank order. */
static void check_epoch(uint64_t n, uint64_t b, int world, bool drop, uint64_t epoch) {
  dt_sampler ref, s[8];
  dt_sampler_cfg c = cfg_of(n, b, 0, 1, drop);
  assert_int_equal(dt_sampler_init(&ref, &c), DT_OK);
  dt_sampler_set_epoch(&ref, epoch);
  for (int r = 0; r < world; r++) {
    c = cfg_of(n, b, r, world, drop);
    assert_int_equal(dt_sampler_init(&s[r], &c), DT_OK);
    dt_sampler_set_epoch(&s[r], epoch);
    assert_int_equal(dt_sampler_max_local(&s[r]), (b + world - 1) / world);
  }
  uint32_t *gidx = malloc(b * sizeof(uint32_t)), *lidx = malloc(b * sizeof(uint32_t));
  char *seen = calloc(n, 1);
  uint64_t steps = 0, total = 0, gl, ll;
  while (dt_sampler_next(&ref, gidx, &ll, &gl)) {
    assert_int_equal(ll, gl);
    uint64_t off = 0;
    for (int r = 0; r < world; r++) {
      uint64_t g;
      assert_true(dt_sampler_next(&s[r], lidx, &ll, &g));
      assert_int_equal(g, gl);
      /* Documented split: b/world each, the first b%world ranks one more, in rank order. */
      uint64_t want = gl / world + ((uint64_t)r < gl % world ? 1 : 0);
      assert_int_equal(ll, want);
      assert_memory_equal(lidx, gidx + off, ll * sizeof(uint32_t));
      assert_int_equal(dt_sampler_shard_first(&s[r], gl), off);
      off += ll;
    }
    assert_int_equal(off, gl); /* shards cover the global batch exactly */
    for (uint64_t i = 0; i < gl; i++) {
      assert_false(seen[gidx[i]]);
      seen[gidx[i]] = 1;
    }
    total += gl;
    steps++;
  }
  for (int r = 0; r < world; r++) {
    uint64_t g;
    assert_false(dt_sampler_next(&s[r], lidx, &ll, &g));
    assert_int_equal(steps, dt_sampler_steps_per_epoch(&s[r]));
    dt_sampler_free(&s[r]);
  }
  assert_int_equal(total, drop ? (n / b) * b : n);
  free(gidx);
  free(lidx);
  free(seen);
  dt_sampler_free(&ref);
}

static void test_shards(void **st) {
  const uint64_t ns[] = {1, 7, 100, 1000};
  const uint64_t bs[] = {1, 3, 8, 10, 128};
  const int ws[] = {1, 2, 3, 4, 8};
  for (size_t i = 0; i < 4; i++)
    for (size_t j = 0; j < 5; j++)
      for (size_t k = 0; k < 5; k++)
        for (int drop = 0; drop < 2; drop++) {
          if (drop && bs[j] > ns[i])
            continue;
          check_epoch(ns[i], bs[j], ws[k], drop, 3);
        }
}

static void test_permutation(void **st) {
  dt_sampler a, b;
  dt_sampler_cfg c = cfg_of(1000, 10, 0, 1, false);
  assert_int_equal(dt_sampler_init(&a, &c), DT_OK);
  c.rank = 2;
  c.world = 3;
  assert_int_equal(dt_sampler_init(&b, &c), DT_OK);
  /* Same permutation on every rank, and a permutation indeed. */
  assert_memory_equal(a.perm, b.perm, 1000 * sizeof(uint32_t));
  char seen[1000] = {0};
  for (int i = 0; i < 1000; i++)
    seen[a.perm[i]]++;
  for (int i = 0; i < 1000; i++)
    assert_int_equal(seen[i], 1);
  uint32_t *e0 = malloc(4000);
  memcpy(e0, a.perm, 4000);
  dt_sampler_set_epoch(&a, 1);
  assert_memory_not_equal(a.perm, e0, 4000); /* reshuffled each epoch */
  int fixed = 0;
  for (int i = 0; i < 1000; i++)
    fixed += a.perm[i] == e0[i];
  assert_true(fixed < 20); /* ~1 expected for independent permutations */
  dt_sampler_set_epoch(&a, 0);
  assert_memory_equal(a.perm, e0, 4000); /* a function of (seed, epoch) only */
  dt_sampler_free(&b);
  c.seed = 43;
  assert_int_equal(dt_sampler_init(&b, &c), DT_OK);
  assert_memory_not_equal(b.perm, e0, 4000);
  dt_sampler_free(&b);
  c.shuffle = false;
  assert_int_equal(dt_sampler_init(&b, &c), DT_OK);
  for (int i = 0; i < 1000; i++)
    assert_int_equal(b.perm[i], i);
  dt_sampler_free(&b);
  dt_sampler_free(&a);
  free(e0);
}

static void test_resume(void **st) {
  /* Run 2 ranks through 2.5 epochs, save the state mid-epoch, restore it into fresh samplers
   * (also with world 3) and compare the continuations with the uninterrupted ones. */
  const uint64_t n = 103, B = 10;
  dt_sampler run, cont;
  dt_sampler_cfg c = cfg_of(n, B, 0, 1, false);
  assert_int_equal(dt_sampler_init(&run, &c), DT_OK);
  uint32_t buf[16], buf2[16];
  uint64_t l, g, l2, g2;
  int steps = 0;
  dt_sampler_state saved = {0};
  for (uint64_t ep = 0; ep < 3; ep++) {
    dt_sampler_set_epoch(&run, ep);
    while (dt_sampler_next(&run, buf, &l, &g)) {
      if (++steps == 17)
        saved = run.st;
    }
  }
  dt_sampler_free(&run);
  assert_int_equal(saved.epoch, 1);
  assert_int_equal(saved.pos, 60); /* 11 batches in epoch 0, 6 into epoch 1 */
  for (int world = 1; world <= 3; world++)
    for (int r = 0; r < world; r++) {
      c = cfg_of(n, B, 0, 1, false);
      assert_int_equal(dt_sampler_init(&run, &c), DT_OK);
      c = cfg_of(n, B, r, world, false);
      assert_int_equal(dt_sampler_init(&cont, &c), DT_OK);
      assert_int_equal(dt_sampler_restore(&cont, &saved), DT_OK);
      dt_sampler_set_epoch(&run, 1);
      for (int i = 0; i < 6; i++)
        assert_true(dt_sampler_next(&run, buf, &l, &g));
      for (;;) {
        bool a = dt_sampler_next(&run, buf, &l, &g), b = dt_sampler_next(&cont, buf2, &l2, &g2);
        assert_int_equal(a, b);
        if (!a)
          break;
        assert_int_equal(g, g2);
        uint64_t ur = (uint64_t)r, off = ur * (g / world) + (ur < g % world ? ur : g % world);
        assert_memory_equal(buf + off, buf2, l2 * 4);
      }
      dt_sampler_free(&run);
      dt_sampler_free(&cont);
    }
  c = cfg_of(n, B, 0, 1, false);
  assert_int_equal(dt_sampler_init(&cont, &c), DT_OK);
  dt_sampler_state bad = saved;
  bad.seed = 7;
  assert_int_equal(dt_sampler_restore(&cont, &bad), DT_ERR_INVALID);
  bad = saved;
  bad.pos = n + 1;
  assert_int_equal(dt_sampler_restore(&cont, &bad), DT_ERR_INVALID);
  dt_sampler_free(&cont);
}

static void test_bad_config(void **st) {
  dt_sampler s;
  dt_sampler_cfg c = cfg_of(0, 1, 0, 1, false);
  assert_int_equal(dt_sampler_init(&s, &c), DT_ERR_INVALID);
  c = cfg_of(10, 0, 0, 1, false);
  assert_int_equal(dt_sampler_init(&s, &c), DT_ERR_INVALID);
  c = cfg_of(10, 2, 2, 2, false);
  assert_int_equal(dt_sampler_init(&s, &c), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "rank 2 of world 2"));
  c = cfg_of(10, 20, 0, 1, true);
  assert_int_equal(dt_sampler_init(&s, &c), DT_ERR_INVALID);
  dt_sampler_free(&s);
  dt_sampler_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_shards), cmocka_unit_test(test_permutation),
      cmocka_unit_test(test_resume), cmocka_unit_test(test_bad_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
