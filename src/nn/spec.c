/* spec.c - the model spec language: presets, the parser with its shape checks, and its help.
 * Produces a plain list of layer descriptions; building buffers is model.c's job. Only
 * sequential stacks are expressible (no branches or residuals). */
#include <ctype.h>
#include <stdarg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn.h"

#define SPEC_MAX_DIM (1 << 20)   /* any single size; keeps every product within size_t */
#define SPEC_MAX_ACT ((size_t)1 << 28) /* values per sample of the input or a convolution's output */
#define SPEC_MAX_TOKENS 256

static const struct {
  const char *name, *spec;
} spec_presets[] = {
    {"mlp", "in=1x28x28,linear:1024,relu,linear:1024,relu,linear:10"},
    {"cnn", "in=1x28x28,conv5x5:32:p2,relu,maxpool2,conv5x5:64:p2,relu,maxpool2,flatten,"
            "linear:512,relu,linear:10"},
};

const char *dt_model_spec_help(void) {
  return "A preset name, or layers separated by commas, applied in order:\n"
         "  presets:  mlp = 784-1024-1024-10 with relu\n"
         "            cnn = conv5x5 1->32 pad 2, relu, maxpool2, conv5x5 32->64 pad 2, relu,\n"
         "                  maxpool2, linear 3136->512, relu, linear 512->10\n"
         "  in=CxHxW | in=F     input shape, first token only (default in=1x28x28)\n"
         "  linear:N            fully connected, N outputs (flattens an image input)\n"
         "  convKxK:N[:sS][:pP] KxK convolution to N channels, stride S (1), zero padding P (0)\n"
         "  maxpoolK[:sS]       KxK max pooling, stride S (default K)\n"
         "  avgpoolK[:sS]       KxK average pooling, stride S (default K)\n"
         "  relu | gelu         activations\n"
         "  dropout:P           zero each value with probability P during training\n"
         "  layernorm           normalize each sample's features (needs a flat input)\n"
         "  flatten             image to feature vector (channels-last order)\n"
         "  The last layer's outputs are the class logits (softmax cross-entropy).\n"
         "  example: conv3x3:16:p1,relu,maxpool2,flatten,linear:128,relu,dropout:0.2,linear:10\n";
}

/* Shared state while parsing one spec: where we are, for error messages. */
typedef struct {
  const char *spec;
  const char *tok; /* current token text (NUL-terminated copy) */
  int tokno;
} spec_ctx;

static dt_status spec_err(const spec_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static dt_status spec_err(const spec_ctx *c, const char *fmt, ...) {
  char why[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return dt_set_error(DT_ERR_INVALID, "model spec \"%s\": token %d \"%s\": %s", c->spec, c->tokno,
                      c->tok, why);
}

/* Reads a decimal integer in [lo, hi] at *p, advancing *p. */
static bool spec_int(const char **p, long lo, long hi, long *out) {
  if (!isdigit((unsigned char)**p))
    return false;
  errno = 0;
  char *end;
  long v = strtol(*p, &end, 10);
  if (errno || v < lo || v > hi)
    return false;
  *p = end;
  *out = v;
  return true;
}

/* Optional ":sS" / ":pP" suffixes of conv and pool tokens. */
static dt_status spec_opts(const spec_ctx *c, const char *p, bool allow_pad, int *stride, int *pad) {
  while (*p) {
    if (*p != ':')
      return spec_err(c, "unexpected \"%s\" (options are :sS for stride%s)", p,
                      allow_pad ? ", :pP for padding" : "");
    p++;
    char o = *p++;
    long v;
    if (o == 's') {
      if (!spec_int(&p, 1, SPEC_MAX_DIM, &v))
        return spec_err(c, "stride must be an integer >= 1");
      *stride = (int)v;
    } else if (o == 'p' && allow_pad) {
      if (!spec_int(&p, 0, SPEC_MAX_DIM, &v))
        return spec_err(c, "padding must be an integer >= 0");
      *pad = (int)v;
    } else {
      return spec_err(c, "unknown option ':%c' (options are :sS for stride%s)", o ? o : ' ',
                      allow_pad ? ", :pP for padding" : "");
    }
  }
  return DT_OK;
}

static dt_status spec_token(const spec_ctx *c, nn_shape *s, bool *flat, nn_spec_layer *L, int *nL,
                            int cap) {
  const char *t = c->tok;
  nn_spec_layer l = {0};
  l.stride = 1;
  long v;
  if (*nL + 2 > cap)
    return spec_err(c, "too many layers (at most %d)", cap - 1);
  if (!strncmp(t, "linear:", 7) || !strncmp(t, "fc:", 3)) {
    const char *p = strchr(t, ':') + 1;
    if (!spec_int(&p, 1, SPEC_MAX_DIM, &v) || *p)
      return spec_err(c, "output size must be an integer in [1, %d]", SPEC_MAX_DIM);
    if (!*flat) { /* implicit flatten: same memory, channels-last order */
      L[(*nL)++] = (nn_spec_layer){.kind = NN_FLATTEN};
      *s = (nn_shape){(int)nn_shape_size(*s), 1, 1};
      *flat = true;
    }
    if ((size_t)s->c * (size_t)v > (size_t)1 << 31)
      return spec_err(c, "weight of %d x %ld is too large", s->c, v);
    l.kind = NN_LINEAR;
    l.n = (int)v;
    *s = (nn_shape){l.n, 1, 1};
  } else if (!strncmp(t, "conv", 4)) {
    const char *p = t + 4;
    long k, k2;
    if (!spec_int(&p, 1, 64, &k))
      return spec_err(c, "kernel size must be an integer in [1, 64] (e.g. conv5x5:32)");
    if (*p == 'x') {
      p++;
      if (!spec_int(&p, 1, 64, &k2))
        return spec_err(c, "kernel size must be KxK with K in [1, 64]");
      if (k2 != k)
        return spec_err(c, "only square kernels are supported (got %ldx%ld)", k, k2);
    }
    if (*p != ':')
      return spec_err(c, "expected ':N' output channels after the kernel size");
    p++;
    if (!spec_int(&p, 1, SPEC_MAX_DIM, &v))
      return spec_err(c, "output channels must be an integer in [1, %d]", SPEC_MAX_DIM);
    l.kind = NN_CONV;
    l.k = (int)k;
    l.n = (int)v;
    DT_CHECK(spec_opts(c, p, true, &l.stride, &l.pad));
    if (*flat)
      return spec_err(c, "convolution needs an image input (CxHxW), got %d flat features",
                      s->c);
    if (l.pad >= l.k)
      return spec_err(c, "padding %d must be smaller than the kernel %d", l.pad, l.k);
    long hp = s->h + 2L * l.pad, wp = s->w + 2L * l.pad;
    if (hp < l.k || wp < l.k)
      return spec_err(c, "kernel %dx%d does not fit input %dx%dx%d with padding %d", l.k, l.k,
                      s->c, s->h, s->w, l.pad);
    if ((size_t)l.k * l.k * s->c * l.n > (size_t)1 << 31)
      return spec_err(c, "weight is too large");
    *s = (nn_shape){l.n, (int)((hp - l.k) / l.stride + 1), (int)((wp - l.k) / l.stride + 1)};
    if (nn_shape_size(*s) > SPEC_MAX_ACT) /* the flattened size must stay an int */
      return spec_err(c, "output of %dx%dx%d is too large (%zu values per sample, at most %zu)", s->c, s->h, s->w,
                      nn_shape_size(*s), SPEC_MAX_ACT);
  } else if (!strncmp(t, "maxpool", 7) || !strncmp(t, "avgpool", 7)) {
    const char *p = t + 7;
    if (!spec_int(&p, 1, 64, &v))
      return spec_err(c, "pool size must be an integer in [1, 64] (e.g. maxpool2)");
    l.kind = t[0] == 'm' ? NN_MAXPOOL : NN_AVGPOOL;
    l.k = (int)v;
    l.stride = l.k;
    DT_CHECK(spec_opts(c, p, false, &l.stride, &l.pad));
    if (*flat)
      return spec_err(c, "pooling needs an image input (CxHxW), got %d flat features", s->c);
    if (s->h < l.k || s->w < l.k)
      return spec_err(c, "pool %dx%d does not fit input %dx%dx%d", l.k, l.k, s->c, s->h, s->w);
    *s = (nn_shape){s->c, (s->h - l.k) / l.stride + 1, (s->w - l.k) / l.stride + 1};
  } else if (!strcmp(t, "relu")) {
    l.kind = NN_RELU;
  } else if (!strcmp(t, "gelu")) {
    l.kind = NN_GELU;
  } else if (!strcmp(t, "flatten")) {
    l.kind = NN_FLATTEN;
    *s = (nn_shape){(int)nn_shape_size(*s), 1, 1};
    *flat = true;
  } else if (!strcmp(t, "layernorm")) {
    if (!*flat)
      return spec_err(c, "layernorm needs a flat input; got %dx%dx%d (add flatten first)", s->c,
                      s->h, s->w);
    if (s->c < 2)
      return spec_err(c, "layernorm needs at least 2 features, got %d", s->c);
    l.kind = NN_LAYERNORM;
  } else if (!strncmp(t, "dropout", 7)) {
    const char *p = t + 7;
    if (*p != ':')
      return spec_err(c, "expected dropout:P with P in [0, 1)");
    char *end;
    errno = 0;
    double d = strtod(p + 1, &end);
    if (errno || end == p + 1 || *end || !(d >= 0.0 && d < 1.0))
      return spec_err(c, "dropout probability must be a number in [0, 1)");
    if (!((float)d < 1.0f)) /* kept as a float */
      return spec_err(c, "dropout probability rounds to 1 as a 32-bit float: at most 0.99999994");
    l.kind = NN_DROPOUT;
    l.p = (float)d;
  } else if (!strncmp(t, "in=", 3)) {
    return spec_err(c, "the input shape may only be the first token");
  } else if (!*t) {
    return spec_err(c, "empty token (two commas in a row?)");
  } else {
    return spec_err(c, "unknown layer (expected linear, conv, maxpool, avgpool, relu, gelu, "
                       "dropout, layernorm or flatten; see dtrain train --help)");
  }
  L[(*nL)++] = l;
  return DT_OK;
}

static dt_status spec_input(const spec_ctx *c, nn_shape *s, bool *flat) {
  const char *p = c->tok + 3;
  long d[3];
  int n = 0;
  while (n < 3) {
    if (!spec_int(&p, 1, SPEC_MAX_DIM, &d[n]))
      return spec_err(c, "input sizes must be integers in [1, %d] (in=CxHxW or in=F)",
                      SPEC_MAX_DIM);
    n++;
    if (*p != 'x')
      break;
    p++;
  }
  if (*p || n == 2)
    return spec_err(c, "input must be in=CxHxW or in=F");
  if (n == 1) {
    *s = (nn_shape){(int)d[0], 1, 1};
    *flat = true;
  } else {
    if ((size_t)d[0] * (size_t)d[1] * (size_t)d[2] > SPEC_MAX_ACT)
      return spec_err(c, "input of %ldx%ldx%ld is too large", d[0], d[1], d[2]);
    *s = (nn_shape){(int)d[0], (int)d[1], (int)d[2]};
    *flat = false;
  }
  return DT_OK;
}

dt_status dt__nn_parse_spec(const char *spec, nn_shape *in, nn_spec_layer **layers, int *n) {
  *layers = NULL;
  *n = 0;
  if (!spec)
    return dt_set_error(DT_ERR_INVALID, "model spec is NULL");
  const char *text = spec;
  for (size_t i = 0; i < DT_ARRAY_LEN(spec_presets); i++)
    if (!strcmp(spec, spec_presets[i].name))
      text = spec_presets[i].spec;
  size_t len = strlen(text);
  if (len == 0)
    return dt_set_error(DT_ERR_INVALID, "model spec is empty (use mlp, cnn or a layer list)");
  char *buf = dt__alloc(len + 1);
  nn_spec_layer *L = dt__calloc(SPEC_MAX_TOKENS * sizeof *L);
  if (!buf || !L) {
    dt__free(buf);
    dt__free(L);
    return dt_set_error(DT_ERR_NOMEM, "model spec: out of memory");
  }
  memcpy(buf, text, len + 1);
  spec_ctx c = {.spec = spec};
  nn_shape s = {1, 28, 28};
  bool flat = false;
  nn_shape in0 = s;
  int nL = 0;
  dt_status rc = DT_OK;
  char *p = buf;
  for (int tokno = 1;; tokno++) {
    char *comma = strchr(p, ',');
    if (comma)
      *comma = '\0';
    /* trim blanks */
    while (isspace((unsigned char)*p))
      p++;
    char *e = p + strlen(p);
    while (e > p && isspace((unsigned char)e[-1]))
      *--e = '\0';
    c.tok = p;
    c.tokno = tokno;
    if (tokno == 1 && !strncmp(p, "in=", 3)) {
      rc = spec_input(&c, &s, &flat);
      in0 = s;
    } else
      rc = spec_token(&c, &s, &flat, L, &nL, SPEC_MAX_TOKENS);
    if (rc != DT_OK)
      goto fail;
    if (!comma)
      break;
    p = comma + 1;
  }
  if (!flat) {
    c.tok = "(end)";
    rc = spec_err(&c, "the model ends with an image of %dx%dx%d; add flatten,linear:N to produce "
                      "class logits", s.c, s.h, s.w);
    goto fail;
  }
  dt__free(buf);
  *in = in0;
  *layers = L;
  *n = nL;
  return DT_OK;
fail:
  dt__free(buf);
  dt__free(L);
  return rc;
}
