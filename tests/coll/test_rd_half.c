/* test_rd_half.c - the recursive-doubling allreduce of f16/bf16 gives exactly the bits of one f32
 * accumulation rounded once, now that it moves the half types themselves where an exchange carries
 * two original inputs (rd.c): at 2 ranks the whole collective, at 3-5 ranks the fold and the first
 * doubling round, and the hand-back of the rounded result.
 *
 * Each rank knows every rank's input (a function of rank and index, plus fixed edge values: the
 * largest finite value on every rank, where avg overflows if the sum is rounded before the
 * division; subnormals; +0/-0 for min/max; a quiet NaN with a payload on one rank), simulates rd's
 * tree in f32 (fold, then lower-rank op higher-rank per round, avg divided by n) with one rounding
 * at the end, and requires bit equality for every dtype f16/bf16 x op x count, in and out of
 * place, on shm and tcp, with 2 to 5 ranks. At 2 ranks on shm it also requires the transport's
 * own allreduce ("shm") to give the same bits (except min/max of +0 and -0, see below). It does not time anything.
 *
 * Usage: test_rd_half <shm|tcp> <ranks,...> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mp.h"
#include "coll/sweep.h"

static const size_t counts[] = {1, 7, 16, 17, 33, 4099};

static uint16_t input(int r, size_t i, dt_dtype t, dt_op op, uint64_t salt) {
  int f16 = t == DT_F16;
  switch (i % 97) { /* edge values at fixed indices */
  case 3: return f16 ? 0x7bffu : 0x7f7fu; /* largest finite, every rank */
  case 5: return (uint16_t)(r % 2 ? 0x0001u : 0x0003u); /* subnormals */
  case 8: return (uint16_t)(r % 2 ? 0x8000u : 0x0000u); /* -0 / +0 */
  case 11: return r == 0 ? (f16 ? 0x7e01u : 0x7fc1u) : (f16 ? 0x3c00u : 0x3f80u); /* NaN on rank 0 */
  default: break;
  }
  float v = (float)sw_value(salt, r, i, t, op);
  return f16 ? dt__f32_to_f16(v) : dt__f32_to_bf16(v);
}

static float widen(uint16_t h, dt_dtype t) { return t == DT_F16 ? dt__f16_to_f32(h) : dt__bf16_to_f32(h); }

static float op2(float x, float y, dt_op op) {
  switch (op) {
  case DT_PROD: return x * y;
  case DT_MIN: return x != x ? x : x < y ? x : y;
  case DT_MAX: return x != x ? x : x > y ? x : y;
  default: return x + y; /* sum, avg */
  }
}

/* rd's tree over n ranks for element i, in f32, rounded once. */
static uint16_t expect(int n, size_t i, dt_dtype t, dt_op op, uint64_t salt) {
  float v[64];
  int p2 = 1;
  while (p2 * 2 <= n)
    p2 *= 2;
  int extra = n - p2;
  for (int vr = 0; vr < p2; vr++) {
    int r = vr < extra ? vr * 2 + 1 : vr + extra;
    v[vr] = widen(input(r, i, t, op, salt), t);
    if (vr < extra)
      v[vr] = op2(widen(input(r - 1, i, t, op, salt), t), v[vr], op);
  }
  for (int mask = 1; mask < p2; mask <<= 1) {
    float nv[64];
    for (int vr = 0; vr < p2; vr++) {
      int pv = vr ^ mask;
      nv[vr] = pv < vr ? op2(v[pv], v[vr], op) : op2(v[vr], v[pv], op);
    }
    memcpy(v, nv, sizeof(float) * (size_t)p2);
  }
  float f = op == DT_AVG ? v[0] / (float)n : v[0];
  return t == DT_F16 ? dt__f32_to_f16(f) : dt__f32_to_bf16(f);
}

/* The shm path orders min/max of +0 and -0 differently from rd (it returns +0 for min(+0, -0),
 * rd the second operand, -0, as reduce.c documents): those elements are not compared there. */
static int signed_zero_minmax(size_t i, dt_op op) { return (op == DT_MIN || op == DT_MAX) && i % 97 == 8; }

static int memcmp_skip(const uint16_t *a, const uint16_t *b, size_t count, dt_op op) {
  for (size_t i = 0; i < count; i++)
    if (a[i] != b[i] && !signed_zero_minmax(i, op))
      return 1;
  return 0;
}

static int body(int rank, int size, void *arg) {
  setenv("DTRAIN_TRANSPORT", (const char *)arg, 1);
  dt_comm *c;
  if (dt_comm_create(NULL, &c)) {
    fprintf(stderr, "rank %d: create: %s\n", rank, dt_last_error());
    return 2;
  }
  int fails = 0;
  uint64_t salt = 7;
  uint16_t *in = malloc(4099 * 2), *out = malloc(4099 * 2), *ref = malloc(4099 * 2);
  for (int t = DT_F16; t <= DT_BF16 && !fails; t += DT_BF16 - DT_F16)
    for (int op = 0; op < DT_OP_COUNT && !fails; op++)
      for (size_t ci = 0; ci < sizeof counts / sizeof *counts && !fails; ci++, salt++) {
        size_t count = counts[ci];
        for (int pass = 0; pass < 2; pass++) {
          const char *algo = pass == 0 ? "rd" : "shm";
          if (pass == 1 && !(size == 2 && c->ops->allreduce))
            break;
          setenv("DTRAIN_ALGO", algo, 1);
          dt__coll_algo_load(c); /* a communicator reads it when it is made */
          for (size_t i = 0; i < count; i++)
            in[i] = input(rank, i, (dt_dtype)t, (dt_op)op, salt);
          int inplace = (int)(ci + (size_t)op) % 2;
          if (inplace)
            memcpy(out, in, count * 2);
          else
            memset(out, 0xa5, count * 2);
          dt_status st = dt_comm_allreduce(c, inplace ? DT_IN_PLACE : in, out, count, (dt_dtype)t, (dt_op)op);
          if (st) {
            fprintf(stderr, "rank %d: %s allreduce: %s\n", rank, algo, dt_last_error());
            fails++;
            break;
          }
          for (size_t i = 0; i < count; i++) {
            if (pass == 1 && signed_zero_minmax(i, (dt_op)op))
              continue;
            uint16_t want = expect(size, i, (dt_dtype)t, (dt_op)op, salt);
            if (out[i] != want) {
              fprintf(stderr, "rank %d: %s n %d %s %s count %zu element %zu: 0x%04x, want 0x%04x (one rounding)\n",
                      rank, algo, size, dt_dtype_name((dt_dtype)t), dt_op_name((dt_op)op), count, i, out[i], want);
              fails++;
              break;
            }
          }
          if (pass == 0)
            memcpy(ref, out, count * 2);
          else if (memcmp_skip(ref, out, count, (dt_op)op)) {
            fprintf(stderr, "rank %d: rd and shm differ: %s %s count %zu\n", rank, dt_dtype_name((dt_dtype)t),
                    dt_op_name((dt_op)op), count);
            fails++;
          }
        }
      }
  free(in);
  free(out);
  free(ref);
  dt_comm_destroy(c);
  return fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s <shm|tcp> <ranks,...>\n", argv[0]);
    return 2;
  }
  int bad = 0;
  for (char *s = strtok(argv[2], ","); s; s = strtok(NULL, ",")) {
    int n = atoi(s);
    int f = mp_run(n, body, argv[1], 120);
    printf("%s, %d ranks: %s\n", argv[1], n, f ? "FAIL" : "ok");
    bad += f != 0;
  }
  return bad ? 1 : 0;
}
