/* test_loader.c - the prefetching loader hands out exactly the serial reference's batches
 * (sample rows and labels in sampler order, across epoch boundaries) whatever the timing of the
 * consumer; a held batch is never overwritten while the next one is prefetched; seek resumes
 * exactly; destroy stops cleanly at any point. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dtrain/data.h"

enum { N = 257, C = 1, H = 3, W = 5, SF = C * H * W };

/* The float each row must arrive as: p / 255 as the dataset's scaling computes it. */
static float images[N * SF];

static dt_dataset make_ds(void) {
  dt_dataset ds = {.n = N, .c = C, .h = H, .w = W, .num_classes = 10};
  ds.pixels = malloc(N * SF);
  ds.labels = malloc(sizeof(int32_t) * N);
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < SF; j++) /* row i is recognisable: its first two pixels spell i */
      ds.pixels[i * SF + j] = (uint8_t)(j == 0 ? i & 255 : j == 1 ? i >> 8 : (i * 3 + j * 29) & 255);
    ds.labels[i] = i % 10;
  }
  assert_int_equal(dt_dataset_set_scaling(&ds, NULL), DT_OK);
  for (int i = 0; i < N * SF; i++)
    images[i] = (float)ds.pixels[i] * (1.f / 255.f);
  return ds;
}

static void nap(unsigned *seed) {
  struct timespec ts = {0, (long)(rand_r(seed) % 300) * 1000}; /* 0-300 us, bounded */
  nanosleep(&ts, NULL);
}

/* Checks a batch against the reference sampler's next draw (rolling epochs like the loader). */
static void check_batch(const dt_dataset *ds, dt_sampler *ref, const dt_batch *b, uint32_t *idx) {
  uint64_t l, g;
  if (!dt_sampler_next(ref, idx, &l, &g)) {
    dt_sampler_set_epoch(ref, ref->st.epoch + 1);
    assert_true(dt_sampler_next(ref, idx, &l, &g));
  }
  assert_int_equal(b->n, l);
  assert_int_equal(b->global_n, g);
  assert_int_equal(b->first, dt_sampler_shard_first(ref, g));
  assert_int_equal(b->epoch, ref->st.epoch);
  assert_int_equal(b->after.pos, ref->st.pos);
  assert_int_equal(b->after.epoch, ref->st.epoch);
  for (uint64_t i = 0; i < l; i++) {
    assert_memory_equal(b->x + i * SF, images + (size_t)idx[i] * SF, SF * sizeof(float));
    assert_int_equal(b->y[i], ds->labels[idx[i]]);
  }
}

static void run_case(const dt_dataset *ds, int rank, int world, uint64_t B, bool drop,
                     bool prefetch, unsigned seed) {
  dt_sampler_cfg cfg = {.num_samples = N, .global_batch = B, .rank = rank, .world = world,
                        .seed = 9, .shuffle = true, .drop_last = drop};
  dt_loader_opts o = {.prefetch = prefetch};
  dt_loader *l;
  assert_int_equal(dt_loader_create(ds, &cfg, &o, &l), DT_OK);
  dt_sampler ref;
  assert_int_equal(dt_sampler_init(&ref, &cfg), DT_OK);
  uint32_t *idx = malloc(B * sizeof(uint32_t));
  uint64_t spe = dt_sampler_steps_per_epoch(&ref), steps = 3 * spe + 2;
  for (uint64_t s = 0; s < steps; s++) {
    dt_batch b;
    assert_int_equal(dt_loader_next(l, &b), DT_OK);
    assert_int_equal(b.step, s % spe);
    assert_int_equal(b.last_in_epoch, s % spe == spe - 1);
    nap(&seed); /* the producer races ahead while we "train" on b */
    check_batch(ds, &ref, &b, idx); /* after the nap: b must not have been overwritten */
  }
  free(idx);
  dt_sampler_free(&ref);
  dt_loader_destroy(l);
}

static void test_equals_serial(void **st) {
  dt_dataset ds = make_ds();
  unsigned seed = 1;
  for (int prefetch = 0; prefetch < 2; prefetch++)
    for (int world = 1; world <= 3; world++)
      for (int r = 0; r < world; r++) {
        run_case(&ds, r, world, 32, false, prefetch, seed++);
        run_case(&ds, r, world, 10, true, prefetch, seed++);
      }
  free(ds.pixels);
  free(ds.labels);
}

static void test_seek(void **st) {
  dt_dataset ds = make_ds();
  dt_sampler_cfg cfg = {.num_samples = N, .global_batch = 16, .rank = 1, .world = 2, .seed = 3,
                        .shuffle = true};
  dt_loader_opts o = {.prefetch = true};
  dt_loader *a, *b;
  assert_int_equal(dt_loader_create(&ds, &cfg, &o, &a), DT_OK);
  dt_batch ba, bb;
  for (int i = 0; i < 23; i++) /* into the second epoch (17 batches per epoch) */
    assert_int_equal(dt_loader_next(a, &ba), DT_OK);
  dt_sampler_state saved = ba.after;
  assert_int_equal(saved.epoch, 1);
  float *xa = malloc(16 * SF * sizeof(float));
  assert_int_equal(dt_loader_create(&ds, &cfg, &o, &b), DT_OK);
  assert_int_equal(dt_loader_next(b, &bb), DT_OK); /* b has prefetched from the start: discard */
  assert_int_equal(dt_loader_seek(b, &saved), DT_OK);
  for (int i = 0; i < 30; i++) {
    assert_int_equal(dt_loader_next(a, &ba), DT_OK);
    assert_int_equal(dt_loader_next(b, &bb), DT_OK);
    assert_int_equal(ba.n, bb.n);
    assert_int_equal(ba.epoch, bb.epoch);
    assert_int_equal(ba.step, bb.step);
    memcpy(xa, ba.x, ba.n * SF * sizeof(float));
    assert_memory_equal(xa, bb.x, bb.n * SF * sizeof(float));
    assert_memory_equal(ba.y, bb.y, bb.n * sizeof(int32_t));
  }
  /* A state from another seed is refused. */
  saved.seed = 4;
  assert_int_equal(dt_loader_seek(b, &saved), DT_ERR_INVALID);
  free(xa);
  dt_loader_destroy(a);
  dt_loader_destroy(b);
  free(ds.pixels);
  free(ds.labels);
}

static void test_lifecycle(void **st) {
  dt_dataset ds = make_ds();
  dt_sampler_cfg cfg = {.num_samples = N, .global_batch = 8, .rank = 0, .world = 1, .seed = 1};
  dt_loader *l;
  /* Destroy right after create (producer possibly mid-fill) and after a few batches. */
  for (int k = 0; k < 20; k++) {
    assert_int_equal(dt_loader_create(&ds, &cfg, NULL, &l), DT_OK);
    for (int i = 0; i < k % 4; i++) {
      dt_batch b;
      assert_int_equal(dt_loader_next(l, &b), DT_OK);
    }
    dt_loader_destroy(l);
  }
  dt_loader_destroy(NULL);
  cfg.num_samples = N + 1;
  assert_int_equal(dt_loader_create(&ds, &cfg, NULL, &l), DT_ERR_INVALID);
  assert_null(l);
  assert_non_null(strstr(dt_last_error(), "dataset has 257"));
  /* A hand-built set whose scaling was never set would train on zeros: refused. */
  cfg.num_samples = N;
  dt_dataset raw = ds;
  memset(raw.value, 0, sizeof raw.value);
  assert_int_equal(dt_loader_create(&raw, &cfg, NULL, &l), DT_ERR_INVALID);
  assert_null(l);
  assert_non_null(strstr(dt_last_error(), "dt_dataset_set_scaling"));
  free(ds.pixels);
  free(ds.labels);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_equals_serial),
      cmocka_unit_test(test_seek),
      cmocka_unit_test(test_lifecycle),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
