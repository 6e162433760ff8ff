/* monitor.c - the metrics JSONL file and the progress display of `dtrain train` (see
 * dtrain/monitor.h). Runs on the training thread through the trainer's observer callbacks;
 * does no I/O other than one formatted write per event. Deliberately no locking: the trainer
 * calls observers from one thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "dtrain/monitor.h"

struct dt_monitor {
  FILE *metrics;
  char *metrics_path;
  bool metrics_failed;       /* a write failed and was reported */
  bool metrics_fresh;        /* an earlier run's records are still there, to go with the first of ours */
  dt_progress_mode mode;     /* resolved: BAR, LINES or OFF */
  double line_interval_s;
  int64_t last_line_ns;
  int bar_drawn;             /* a bar is on screen without its newline */
};


dt_status dt_monitor_create(const dt_monitor_opts *opts, dt_monitor **out) {
  *out = NULL;
  dt_monitor_opts o = {0};
  if (opts)
    o = *opts;
  dt_monitor *m = dt__calloc(sizeof *m);
  if (!m)
    return dt_set_error(DT_ERR_NOMEM, "monitor: out of memory");
  m->mode = o.progress;
  if (m->mode == DT_PROGRESS_AUTO)
    m->mode = isatty(STDERR_FILENO) ? DT_PROGRESS_BAR : DT_PROGRESS_LINES;
  m->line_interval_s = o.line_interval_s > 0 ? o.line_interval_s : 5.0;
  if (o.metrics_path) {
    dt_status rc = dt__mkdir_parents(o.metrics_path);
    if (rc != DT_OK) {
      dt__free(m);
      return rc;
    }
    /* Locked for as long as the run writes it: a second run with the same --out is refused at
     * start instead of interleaving its records with ours. Opened without waiting (a FIFO with
     * no reader would block the run before its first step), and only a file, a character device
     * (/dev/null) or a FIFO being read is taken. */
    int fd = open(o.metrics_path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (o.append ? O_APPEND : 0), 0644);
    if (fd < 0 && errno == ENXIO) {
      dt__free(m);
      return dt_set_error(DT_ERR_INVALID, "metrics file %s is %s", o.metrics_path, dt__open_failure(o.metrics_path, ENXIO));
    }
    struct stat fst;
    /* an earlier run's records are truncated with our first record, not now: a run refused at
     * start (its checkpoints, its data) leaves them as they were */
    m->metrics_fresh = fd >= 0 && !o.append && fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) && fst.st_size > 0;
    if (fd >= 0 && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
      int e = errno;
      close(fd);
      errno = e;
      fd = -1;
    }
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      close(fd);
      if (e == EWOULDBLOCK) {
        dt__free(m);
        return dt_set_error(DT_ERR_INVALID, "metrics file %s is being written by another run (give each run its own "
                            "--out)", o.metrics_path);
      }
      errno = e;
      fd = -1;
    }
    m->metrics = fd >= 0 ? fdopen(fd, o.append ? "a" : "w") : NULL;
    if (fd >= 0 && !m->metrics)
      close(fd);
    m->metrics_path = dt__strdup(o.metrics_path);
    if (!m->metrics || !m->metrics_path) {
      dt_status st = dt__errno(DT_ERR_IO, "opening metrics file %s", o.metrics_path);
      if (m->metrics)
        fclose(m->metrics);
      dt__free(m->metrics_path);
      dt__free(m);
      return st;
    }
  }
  *out = m;
  return DT_OK;
}

/* Ends a metrics line: flushed now, so a crash loses nothing written. The first failed write (a
 * full disk) is reported at once, not only when the run ends. */
static void metrics_flush(dt_monitor *m) {
  if ((fflush(m->metrics) != 0 || ferror(m->metrics)) && !m->metrics_failed) {
    m->metrics_failed = true;
    DT_LOG_WARN("metrics file %s: write failed: %s; its lines from here on are lost", m->metrics_path,
                strerror(errno));
  }
}

/* The metrics file, once this run has something to write there: an earlier run's records go
 * then. */
static FILE *metrics_begin(dt_monitor *m) {
  if (m->metrics && m->metrics_fresh) {
    m->metrics_fresh = false;
    if (ftruncate(fileno(m->metrics), 0) != 0 && !m->metrics_failed) {
      m->metrics_failed = true;
      (void)lseek(fileno(m->metrics), 0, SEEK_END);
      DT_LOG_WARN("metrics file %s: cannot empty it of the earlier run's records: %s; this run's follow them",
                  m->metrics_path, strerror(errno));
    }
  }
  return m->metrics;
}

static void fmt_hms(char *buf, size_t cap, double s) {
  if (!(s >= 0) || s > 1e7)
    s = 0;
  long t = (long)(s + 0.5);
  if (t >= 3600)
    snprintf(buf, cap, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  else
    snprintf(buf, cap, "%ld:%02ld", t / 60, t % 60);
}

/* Clears the bar so a whole line can be printed in its place. */
static void clear_bar(dt_monitor *m) {
  if (m->bar_drawn) {
    fputs("\r\033[K", stderr);
    m->bar_drawn = 0;
  }
}

static void on_step(void *ctx, const dt_train_step_info *s) {
  dt_monitor *m = ctx;
  if (metrics_begin(m)) {
    FILE *f = m->metrics;
    fprintf(f, "{\"type\":\"step\",\"step\":%lld,\"epoch\":%d,\"step_in_epoch\":%lld",
            (long long)s->step, s->epoch, (long long)s->step_in_epoch);
    dt__json_field(f, ",", "loss", "%.9g", (double)s->loss);
    dt__json_field(f, ",", "lr", "%.9g", (double)s->lr);
    dt__json_field(f, ",", "samples_per_s", "%.1f", s->samples_per_s);
    dt__json_field(f, ",", "compute_ms", "%.4f", s->compute_ms);
    dt__json_field(f, ",", "comm_ms", "%.4f", s->comm_ms);
    dt__json_field(f, ",", "data_ms", "%.4f", s->data_ms);
    dt__json_field(f, ",", "allreduce_bytes", "%.0f", s->allreduce_bytes);
    dt__json_field(f, ",", "busbw_gbps", "%.6g", s->busbw_gbps);
    fprintf(f, ",\"world_size\":%d", s->world_size);
    if (s->world_size > 1) {
      dt__json_field(f, ",", "compute_max_ms", "%.4f", s->compute_max_ms);
      dt__json_field(f, ",", "compute_min_ms", "%.4f", s->compute_min_ms);
      fprintf(f, ",\"slowest_rank\":%d", s->slowest_rank);
    }
    dt__json_field(f, ",", "time", "%.3f", dt_wall_s());
    fputs("}\n", f);
    metrics_flush(m);
  }
  char eta[32];
  fmt_hms(eta, sizeof eta, s->eta_s);
  if (m->mode == DT_PROGRESS_BAR) {
    /* at most ~10 redraws a second: a terminal is slow to scroll through more */
    int64_t now = dt_now_ns();
    if (m->last_line_ns && now - m->last_line_ns < 100000000 && s->step != s->total_steps &&
        s->step_in_epoch != s->steps_per_epoch)
      return;
    m->last_line_ns = now;
    enum { W = 24 };
    char bar[W + 1];
    /* the run's progress (a --max-steps run shorter than an epoch fills it too) */
    int fill = s->total_steps > 0 ? (int)(W * DT_MIN(s->step, s->total_steps) / s->total_steps) : 0;
    for (int i = 0; i < W; i++)
      bar[i] = i < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "\r\033[Kepoch %d/%d [%s] step %lld/%lld loss %.4f %.0f samples/s", s->epoch,
            s->epochs, bar, (long long)s->step, (long long)s->total_steps, (double)s->loss,
            s->samples_per_s);
    if (s->world_size > 1)
      fprintf(stderr, " comm %.1f ms", s->comm_ms);
    fprintf(stderr, " ETA %s", eta);
    fflush(stderr);
    m->bar_drawn = 1;
  } else if (m->mode == DT_PROGRESS_LINES) {
    int64_t now = dt_now_ns();
    if (m->last_line_ns && (double)(now - m->last_line_ns) / 1e9 < m->line_interval_s &&
        s->step != s->total_steps)
      return;
    m->last_line_ns = now;
    fprintf(stderr,
            "epoch %d/%d step %lld/%lld loss %.4f lr %.4g %.0f samples/s compute %.2f ms "
            "comm %.2f ms data %.2f ms",
            s->epoch, s->epochs, (long long)s->step, (long long)s->total_steps, (double)s->loss,
            (double)s->lr, s->samples_per_s, s->compute_ms, s->comm_ms, s->data_ms);
    if (s->world_size > 1)
      fprintf(stderr, " busbw %.2f GB/s slowest rank %d %.2f ms", s->busbw_gbps, s->slowest_rank,
              s->compute_max_ms);
    fprintf(stderr, " ETA %s\n", eta);
  }
}

static void on_epoch(void *ctx, const dt_train_epoch_info *e) {
  dt_monitor *m = ctx;
  if (metrics_begin(m)) {
    FILE *f = m->metrics;
    fprintf(f, "{\"type\":\"epoch\",\"epoch\":%d,\"step\":%lld", e->epoch, (long long)e->step);
    dt__json_field(f, ",", "test_loss", "%.9g", e->test_loss);
    dt__json_field(f, ",", "test_accuracy", "%.6f", e->test_accuracy);
    dt__json_field(f, ",", "train_loss", "%.9g", e->train_loss);
    dt__json_field(f, ",", "epoch_s", "%.3f", e->epoch_s);
    dt__json_field(f, ",", "time", "%.3f", dt_wall_s());
    fputs("}\n", f);
    metrics_flush(m);
  }
  if (m->mode == DT_PROGRESS_OFF)
    return;
  clear_bar(m);
  fprintf(stderr, "epoch %d: test accuracy %.4f, test loss %.4f, train loss %.4f (%.1f s)\n",
          e->epoch, e->test_accuracy, e->test_loss, e->train_loss, e->epoch_s);
}

static void on_note(void *ctx, const char *text) {
  dt_monitor *m = ctx;
  if (metrics_begin(m)) {
    fputs("{\"type\":\"note\",\"text\":", m->metrics);
    dt__json_str(m->metrics, text);
    dt__json_field(m->metrics, ",", "time", "%.3f", dt_wall_s());
    fputs("}\n", m->metrics);
    metrics_flush(m);
  }
  /* a warning is shown even with the progress display off */
  if (m->mode == DT_PROGRESS_OFF && strncmp(text, "warning:", 8) != 0)
    return;
  clear_bar(m);
  fprintf(stderr, "%s\n", text);
}

dt_train_observer dt_monitor_observer(dt_monitor *m) {
  dt_train_observer o = {.ctx = m, .on_step = on_step, .on_epoch = on_epoch, .on_note = on_note};
  return o;
}

void dt_monitor_finish(dt_monitor *m) {
  if (!m)
    return;
  if (m->bar_drawn) {
    fputc('\n', stderr);
    m->bar_drawn = 0;
  }
}

bool dt_monitor_lost(const dt_monitor *m) { return m && m->metrics_failed; }

void dt_monitor_destroy(dt_monitor *m) {
  if (!m)
    return;
  dt_monitor_finish(m);
  if (m->metrics)
    fclose(m->metrics);
  dt__free(m->metrics_path);
  dt__free(m);
}
