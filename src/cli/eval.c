/* eval.c - `dtrain eval --model-file F`: rebuilds the model saved by `dtrain train` (its spec is
 * in the safetensors metadata), loads its parameters and evaluates it on a test set. Single
 * process; no training state is needed. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/core.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"
#include "dtrain/train.h"

#define CMD "eval"
#define HELP_HINT "see 'dtrain eval --help'"

static void help(FILE *f) {
  fprintf(f,
          "usage: dtrain eval --model-file F [--data DIR] [--batch N] [--threads N] [--json]\n"
          "\n"
          "Evaluates a model written by 'dtrain train' (F = DIR/model.safetensors) on the test\n"
          "split (t10k-images/labels) of an IDX directory and prints its accuracy and mean loss.\n"
          "\n"
          "  --model-file F   safetensors file with \"dtrain.model_spec\" in its metadata\n"
          "  --data DIR       IDX directory (default %s)\n"
          "  --batch N        evaluation batch (default 1000)\n"
          "  --threads N      compute threads (default 1)\n"
          "  --json           print one JSON object on stdout (a loss that is not finite,\n"
          "                   e.g. from a NaN weight, is null)\n"
          "  -h, --help       this text\n"
          "\n"
          "Exit codes: 0 done, 1 runtime failure, 2 bad flags, missing or invalid files.\n",
          DT_FASHION_MNIST_DIR);
}

int dt_cli_eval(int argc, char **argv) {
  const char *model_file = NULL, *data = NULL;
  long batch = 1000, threads = 1;
  int json = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      help(stdout);
      return 0;
    }
    if (!strcmp(a, "--json")) {
      json = 1;
      continue;
    }
    const char *eq = strchr(a, '=');
    size_t nl = eq ? (size_t)(eq - a) : strlen(a);
    const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
    int which = 0;
    if (nl == 12 && !strncmp(a, "--model-file", nl)) which = 1;
    else if (nl == 6 && !strncmp(a, "--data", nl)) which = 2;
    else if (nl == 7 && !strncmp(a, "--batch", nl)) which = 3;
    else if (nl == 9 && !strncmp(a, "--threads", nl)) which = 4;
    else
      return dt_cli_usage_error(CMD, HELP_HINT, "unknown %s '%s'",
                                strncmp(a, "--", 2) ? "argument" : "flag", a);
    if (!v)
      return dt_cli_usage_error(CMD, HELP_HINT, "%.*s needs a value", (int)nl, a);
    if (!*v) /* an unset shell variable */
      return dt_cli_usage_error(CMD, HELP_HINT, "bad value '' for %.*s", (int)nl, a);
    if (!eq)
      i++;
    char *end;
    errno = 0;
    if (which == 1) {
      model_file = v;
    } else if (which == 2) {
      data = v;
    } else {
      long n = strtol(v, &end, 10), most = which == 3 ? (1 << 24) : 1024;
      if (errno || end == v || *end || n < 1 || n > most)
        return dt_cli_usage_error(CMD, HELP_HINT, "bad value '%s' for %.*s: a whole number from 1 to %ld", v, (int)nl,
                                  a, most);
      if (which == 3)
        batch = n;
      else
        threads = n;
    }
  }
  if (!model_file)
    return dt_cli_usage_error(CMD, "pass --model-file DIR/model.safetensors (written by dtrain train)",
                              "no --model-file given");
  dt_nn_set_threads((int)threads);
  dt_model *m = NULL;
  dt_status rc = dt_train_model_load(model_file, (int)batch, &m);
  if (rc == DT_ERR_NOMEM && batch > 1)
    return dt_cli_usage_error(CMD, "use a smaller --batch", "--batch %ld: %s", batch, dt_last_error());
  if (rc == DT_ERR_NOMEM) /* one sample at a time does not fit: the model itself is too large here */
    return dt_cli_fail(CMD, "model %s does not fit in this host's memory even with --batch 1: %s", model_file,
                       dt_last_error());
  if (rc != DT_OK)
    return dt_cli_usage_error(CMD, rc == DT_ERR_NOT_FOUND ? "check the path (dtrain train --out DIR "
                                                            "writes DIR/model.safetensors)"
                                                          : "was the file written by dtrain train?",
                              "cannot load model %s: %s", model_file, dt_last_error());
  double loss = 0, acc = 0;
  uint64_t n = 0;
  rc = dt_train_evaluate(m, data, (int)batch, &loss, &acc, &n);
  if (rc != DT_OK) {
    dt_model_destroy(m);
    if (rc == DT_ERR_NOT_FOUND)
      return dt_cli_usage_error(CMD, "apt-get install dataset-fashion-mnist, or pass --data DIR",
                                "%s", dt_last_error());
    if (rc == DT_ERR_INVALID || rc == DT_ERR_UNSUPPORTED)
      return dt_cli_usage_error(CMD, "evaluate on the kind of data the model was trained on (IDX files of u8 "
                                "images and labels)", "%s", dt_last_error());
    if (rc == DT_ERR_CORRUPT)
      return dt_cli_usage_error(CMD, "the file named above is damaged: regenerate it or reinstall "
                                "dataset-fashion-mnist", "%s", dt_last_error());
    return dt_cli_fail(CMD, "evaluation failed");
  }
  if (!isfinite(loss))
    fprintf(stderr, "dtrain eval: warning: the model's outputs are not finite (NaN or Inf) on some samples "
                    "(test loss %g); those count as wrong\n", loss);
  if (json) {
    dt__json_field(stdout, "{", "test_accuracy", "%.10g", acc);
    dt__json_field(stdout, ",", "test_loss", "%.10g", loss);
    printf(",\"samples\":%llu,\"model_file\":", (unsigned long long)n);
    dt__json_str(stdout, model_file);
    fputs(",\"model\":", stdout);
    dt__json_str(stdout, dt_model_spec(m));
    fputs("}\n", stdout);
  } else {
    printf("test accuracy %.4f, test loss %.4f on %llu samples\nmodel: %s (%s)\n", acc, loss,
           (unsigned long long)n, model_file, dt_model_spec(m));
  }
  dt_model_destroy(m);
  return 0;
}
