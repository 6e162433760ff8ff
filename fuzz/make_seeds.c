/* make_seeds.c - writes the seed corpora under fuzz/corpus/ (small valid files of each format,
 * plus a few near-misses). Built with DTRAIN_FUZZ; run once from the source tree:
 *   build-fuzz/fuzz/make_seeds fuzz/corpus
 * The seeds are committed; this program records how they were made. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "dtrain/ckpt.h"

static void put(const char *dir, const char *name, const void *b, size_t n) {
  char p[1024];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(b, 1, n, f) != n) {
    perror(p);
    return;
  }
  fclose(f);
}

static size_t gz(const void *in, size_t n, unsigned char *out, size_t cap) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  zs.next_in = (Bytef *)in;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  deflate(&zs, Z_FINISH);
  size_t k = cap - zs.avail_out;
  deflateEnd(&zs);
  return k;
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : "fuzz/corpus";
  char d[1024];
  /* IDX: labels, images, i32, f64; raw and gzip'd. */
  snprintf(d, sizeof d, "%s/idx", root);
  mkdir(root, 0755);
  mkdir(d, 0755);
  unsigned char lab[] = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 9};
  unsigned char img[4 + 12 + 2 * 3 * 3];
  memcpy(img, "\0\0\x08\x03\0\0\0\x02\0\0\0\x03\0\0\0\x03", 16);
  for (int i = 0; i < 18; i++)
    img[16 + i] = (unsigned char)(i * 14);
  unsigned char i32[] = {0, 0, 0x0C, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0xff, 0xff, 0xff, 0xfe, 0, 1, 0, 0};
  unsigned char f64[] = {0, 0, 0x0E, 1, 0, 0, 0, 1, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0};
  unsigned char z[512];
  put(d, "labels.idx", lab, sizeof lab);
  put(d, "images.idx", img, sizeof img);
  put(d, "i32.idx", i32, sizeof i32);
  put(d, "f64.idx", f64, sizeof f64);
  put(d, "labels.idx.gz", z, gz(lab, sizeof lab, z, sizeof z));
  put(d, "images.idx.gz", z, gz(img, sizeof img, z, sizeof z));
  put(d, "truncated.idx", img, sizeof img - 5);

  /* safetensors: written by the library, plus a hand-made one with escapes and metadata last. */
  snprintf(d, sizeof d, "%s/safetensors", root);
  mkdir(d, 0755);
  float w[6] = {1, 2, 3, 4, 5, 6};
  short h[2] = {1, 2};
  dt_tensor_view t[3] = {
      {.name = "fc.weight", .dtype = DT_ST_F32, .ndim = 2, .shape = {2, 3}, .data = w, .nbytes = 24},
      {.name = "fc.bias", .dtype = DT_ST_BF16, .ndim = 1, .shape = {2}, .data = h, .nbytes = 4},
      {.name = "s", .dtype = DT_ST_F32, .ndim = 0, .data = w, .nbytes = 4},
  };
  dt_kv meta[2] = {{"format", "pt"}, {"model", "mlp:784-1024-10"}};
  char p[1100];
  snprintf(p, sizeof p, "%s/model.safetensors", d);
  dt_safetensors_write(p, t, 3, meta, 2);
  snprintf(p, sizeof p, "%s/empty.safetensors", d);
  dt_safetensors_write(p, NULL, 0, NULL, 0);
  const char *hdr = "{ \"b\\u00e9\" : {\"shape\":[2],\"data_offsets\":[0,8],\"dtype\":\"I32\"},"
                    " \"__metadata__\":{\"k\\n\":\"v\\ud83d\\ude00\"} }";
  unsigned char file[512];
  size_t hl = strlen(hdr);
  for (int i = 0; i < 8; i++)
    file[i] = (unsigned char)((unsigned long long)hl >> (8 * i));
  memcpy(file + 8, hdr, hl);
  memset(file + 8 + hl, 7, 8);
  put(d, "hand.safetensors", file, 8 + hl + 8);

  /* checkpoints */
  snprintf(d, sizeof d, "%s/ckpt", root);
  mkdir(d, 0755);
  dt_ckpt_section s[3] = {{"params", w, sizeof w, 0}, {"opt.m", h, sizeof h, 0}, {"empty", NULL, 0, 0}};
  dt_kv km[3] = {{"step", "12"}, {"epoch", "1"}, {"sampler", "seed=1 epoch=1 pos=256"}};
  snprintf(p, sizeof p, "%s/ckpt-000000012.dtc", d);
  dt_ckpt_write(p, 12, s, 3, km, 3);
  snprintf(p, sizeof p, "%s/ckpt-000000001.dtc", d);
  dt_ckpt_write(p, 1, NULL, 0, NULL, 0);
  return 0;
}
