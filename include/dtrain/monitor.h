/* dtrain/monitor.h - what `dtrain train` shows and records while it trains: a metrics file
 * with one JSON object per logged step and per epoch, and a progress display on standard error
 * (a live single-line bar redrawn in place on a terminal, a plain line every few seconds
 * otherwise). It plugs into the trainer as a dt_train_observer (dtrain/train.h).
 *
 * Metrics file (JSON Lines), one object per line, flushed as written:
 *   {"type":"step","step":120,"epoch":1,"loss":0.51234567,"lr":0.05,"samples_per_s":9120.5,
 *    "compute_ms":12.1,"comm_ms":0.8,"data_ms":0.01,"allreduce_bytes":7458856,
 *    "busbw_gbps":3.1,"world_size":2,"compute_max_ms":12.4,"compute_min_ms":11.9,
 *    "slowest_rank":1,"time":1795000000.123}
 *   (the compute_max/min and slowest_rank fields only with more than one worker)
 *   {"type":"epoch","epoch":1,"step":469,"test_loss":0.46,"test_accuracy":0.8351,
 *    "train_loss":0.58,"epoch_s":6.2,"time":...}
 *   {"type":"note","text":"resumed ...","time":...}
 * Losses are printed with 9 significant digits, so a float survives the round trip exactly.
 * A resumed run appends to the same file: the steps after its checkpoint that the interrupted
 * run had already logged appear again after the "resumed" note (with the same values, since a
 * resume repeats them exactly); a reader keeps the last record of each step.
 *
 * Not here: Chrome-trace timelines, Prometheus, energy (later issues). */
#ifndef DTRAIN_MONITOR_H
#define DTRAIN_MONITOR_H

#include <stdbool.h>

#include "dtrain/core.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_progress_mode {
  DT_PROGRESS_AUTO = 0, /* bar if standard error is a terminal, lines otherwise */
  DT_PROGRESS_BAR,
  DT_PROGRESS_LINES,
  DT_PROGRESS_OFF,
} dt_progress_mode;

typedef struct dt_monitor_opts {
  const char *metrics_path;  /* NULL: no metrics file; parent directories are created */
  bool append;               /* keep what the file holds (resuming) instead of truncating it */
  dt_progress_mode progress;
  double line_interval_s;    /* plain lines: at most one per this many seconds; 0: 5 */
} dt_monitor_opts;

typedef struct dt_monitor dt_monitor;

/* Opens the metrics file. DT_ERR_IO naming the path if it cannot be created. */
dt_status dt_monitor_create(const dt_monitor_opts *opts, dt_monitor **out);
/* The observer to pass to dt_train_run; valid while m lives. */
dt_train_observer dt_monitor_observer(dt_monitor *m);
/* Ends the progress line (if one is drawn) so later output starts on a fresh line. */
void dt_monitor_finish(dt_monitor *m);
/* Whether a write to the metrics file failed (a full disk): its lines from then on are lost. */
bool dt_monitor_lost(const dt_monitor *m);
/* Finishes, closes the file. Accepts NULL. */
void dt_monitor_destroy(dt_monitor *m);

#ifdef __cplusplus
}
#endif
#endif
