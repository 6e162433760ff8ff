/* dtype.c - names, sizes and parsing of element types and reduction ops (dtrain/comm.h).
 * Pure lookups; the arithmetic on these types lives in reduce.c. */
#include <string.h>
#include <strings.h>

#include "comm/comm.h"

static const struct {
  const char *name;
  size_t size;
  const char *alias[3];
} dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = {"f32", 4, {"float32", "float", "fp32"}},
    [DT_F64] = {"f64", 8, {"float64", "double", "fp64"}},
    [DT_F16] = {"f16", 2, {"float16", "half", "fp16"}},
    [DT_BF16] = {"bf16", 2, {"bfloat16", NULL, NULL}},
    [DT_I32] = {"i32", 4, {"int32", "int", NULL}},
    [DT_I64] = {"i64", 8, {"int64", "long", NULL}},
    [DT_U8] = {"u8", 1, {"uint8", "byte", NULL}},
};

static const char *ops[DT_OP_COUNT] = {
    [DT_SUM] = "sum", [DT_PROD] = "prod", [DT_MIN] = "min", [DT_MAX] = "max", [DT_AVG] = "avg",
};

size_t dt_dtype_size(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].size : 0; }

const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].name : "?"; }

const char *dt_op_name(dt_op op) { return (unsigned)op < DT_OP_COUNT ? ops[op] : "?"; }

dt_status dt_dtype_parse(const char *s, dt_dtype *out) {
  if (!s || !out)
    return dt_set_error(DT_ERR_INVALID, "dt_dtype_parse: NULL argument");
  for (int t = 0; t < DT_DTYPE_COUNT; t++) {
    if (!strcasecmp(s, dtypes[t].name)) {
      *out = (dt_dtype)t;
      return DT_OK;
    }
    for (int a = 0; a < 3 && dtypes[t].alias[a]; a++)
      if (!strcasecmp(s, dtypes[t].alias[a])) {
        *out = (dt_dtype)t;
        return DT_OK;
      }
  }
  return dt_set_error(DT_ERR_INVALID, "unknown dtype '%s' (f32, f64, f16, bf16, i32, i64, u8)", s);
}

dt_status dt_op_parse(const char *s, dt_op *out) {
  if (!s || !out)
    return dt_set_error(DT_ERR_INVALID, "dt_op_parse: NULL argument");
  for (int o = 0; o < DT_OP_COUNT; o++)
    if (!strcasecmp(s, ops[o])) {
      *out = (dt_op)o;
      return DT_OK;
    }
  if (!strcasecmp(s, "mean")) {
    *out = DT_AVG;
    return DT_OK;
  }
  if (!strcasecmp(s, "product")) {
    *out = DT_PROD;
    return DT_OK;
  }
  return dt_set_error(DT_ERR_INVALID, "unknown op '%s' (sum, prod, min, max, avg)", s);
}
