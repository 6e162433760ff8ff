/* test_train_e2e.c - issue 3's end-to-end check on the real Fashion-MNIST (Debian's
 * dataset-fashion-mnist): `dtrain train --model mlp --epochs 1 --batch 128 --optimizer sgd
 * --lr 0.05 --momentum 0.9 --json` reaches at least 82% test accuracy (PyTorch reaches 83% with
 * the same recipe), prints one JSON summary, and `dtrain eval` on the saved model gives the same
 * accuracy. Skipped (exit 0 with a note) only if the dataset package is not installed. */
#include "train_test.h"

int main(void) {
  if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK)) {
    printf("skipped: dataset-fashion-mnist is not installed\n");
    return 0;
  }
  char dir[1024];
  tt_scratch(dir, sizeof dir, "e2e");
  const char *b = tt_bin();
  tt_result r = tt_run(dir, 1200,
                       "%s train --model mlp --epochs 1 --batch 128 --optimizer sgd --lr 0.05 "
                       "--momentum 0.9 --threads 2 --out %s/run --json",
                       b, dir);
  CHECK(r.code == 0, "train exit %d: %s", r.code, r.err);
  CHECK(tt_json_is_object(r.out), "stdout is not one JSON object: [%s]", r.out);
  double acc = tt_json_num(r.out, "test_accuracy");
  fprintf(stderr, "summary: %s", r.out);
  CHECK(acc >= 0.82 && acc <= 1, "test accuracy %g < 0.82", acc);
  CHECK(tt_json_num(r.out, "epochs") == 1 && tt_json_num(r.out, "steps") == 469, "epochs/steps");
  char model[4096];
  CHECK(tt_json_str(r.out, "model_file", model, sizeof model), "model_file");
  tt_result_free(&r);
  r = tt_run(dir, 600, "%s eval --model-file %s --json", b, model);
  CHECK(r.code == 0, "eval exit %d: %s", r.code, r.err);
  CHECK(tt_json_num(r.out, "test_accuracy") == acc, "eval accuracy %g != training's %g",
        tt_json_num(r.out, "test_accuracy"), acc);
  CHECK(tt_json_num(r.out, "samples") == 10000, "samples");
  tt_result_free(&r);
  tt_rmrf(dir);
  printf("ok: test accuracy %.4f\n", acc);
  return 0;
}
