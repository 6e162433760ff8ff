/* launch_output.c - what `dtrain run` shows of its workers' output.
 * Splits each worker stream into lines (\n, \r\n, or \r for progress displays), prefixes them
 * with the rank or filters them by mode, writes each line with one write(2) so lines of
 * different ranks never mix, and keeps the last lines of each rank for the failure summary.
 * With raw_stdout, rank 0's stdout is copied byte for byte (no prefix, no splitting) and
 * everything else goes to stderr, so our stdout is exactly rank 0's.
 * It does not read the pipes (launch_job.c does) and never blocks except in write(2) to our
 * own stdout/stderr. */
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/launch.h"
#include "core/core.h"

/* A line longer than this without a terminator is written as a line of its own, so one
 * worker cannot make us hold unbounded memory. */
#define OUT_MAX_LINE (64 * 1024)
/* Tail entries keep at most this much of each line. */
#define OUT_TAIL_CHARS 1024

typedef struct {
  char *buf;
  size_t len, cap;
} lbuf;

typedef struct {
  char *text;   /* NUL-terminated, at most OUT_TAIL_CHARS */
  int progress; /* stream whose \r-progress this entry is (later \r lines replace it), or 0 */
} tail_entry;

typedef struct {
  lbuf line[3]; /* partial line per stream (1, 2) */
  tail_entry *tail;
  int head, count;
  int refuser; /* R + 1 of the last "rank R refused" line (R not this worker), 0 if none */
} out_rank;

struct dt_out {
  int nlocal, rank_base, tail_cap;
  dt_out_mode mode;
  bool raw_stdout;
  out_rank *r;
  bool tty[3];     /* fd 1, 2 are terminals */
  bool dead[3];    /* writes to fd failed (EPIPE): drop further output there */
  bool broken_stdout; /* our stdout's reader went away (EPIPE) */
  int pend_fd;     /* a terminal whose cursor sits after a \r progress line, or an fd whose last
                    * line went out as is without its end (pend_partial), or -1 */
  int pend_src;    /* local*3+stream that wrote it */
  bool pend_partial;
  bool same12;     /* fd 1 and 2 are one file (2>&1): a line on one continues on the other */
  char *scratch;
  size_t scratch_cap;
  int64_t verdict_ns; /* when a worker first printed "rank R failed", 0 before */
  int verdict_rank;   /* that R */
  bool stalled[3];    /* dropped: its reader stopped reading while the job had to stop */
  int world;          /* ranks in the job (0: unknown): a verdict naming another is a worker's text */
  bool (*abandon)(void *ctx); /* the job must stop (a signal, --timeout): a stalled write gives up */
  void *abandon_ctx;
};

void dt__out_set_abandon(dt_out *o, bool (*fn)(void *ctx), void *ctx) {
  o->abandon = fn;
  o->abandon_ctx = ctx;
}

bool dt__out_stalled(const dt_out *o) { return o->stalled[1] || o->stalled[2]; }

void dt__out_set_world(dt_out *o, int world) { o->world = world; }

dt_out *dt__out_create(int nlocal, int rank_base, dt_out_mode mode, bool raw_stdout,
                       int tail_lines) {
  dt_out *o = calloc(1, sizeof *o);
  if (!o)
    return NULL;
  o->nlocal = nlocal;
  o->rank_base = rank_base;
  o->mode = mode;
  o->raw_stdout = raw_stdout;
  o->tail_cap = tail_lines > 0 ? tail_lines : 1;
  o->pend_fd = -1;
  struct stat s1, s2;
  o->same12 = fstat(1, &s1) == 0 && fstat(2, &s2) == 0 && s1.st_dev == s2.st_dev && s1.st_ino == s2.st_ino;
  o->tty[1] = isatty(1);
  o->tty[2] = isatty(2);
  o->r = calloc((size_t)nlocal, sizeof *o->r);
  if (!o->r)
    goto fail;
  for (int i = 0; i < nlocal; i++) {
    o->r[i].tail = calloc((size_t)o->tail_cap, sizeof *o->r[i].tail);
    if (!o->r[i].tail)
      goto fail;
  }
  return o;
fail:
  dt__out_destroy(o);
  return NULL;
}

void dt__out_destroy(dt_out *o) {
  if (!o)
    return;
  for (int i = 0; o->r && i < o->nlocal; i++) {
    for (int s = 1; s <= 2; s++)
      free(o->r[i].line[s].buf);
    for (int k = 0; o->r[i].tail && k < o->tail_cap; k++)
      free(o->r[i].tail[k].text);
    free(o->r[i].tail);
  }
  free(o->r);
  free(o->scratch);
  free(o);
}

/* Writes all of buf; on a broken pipe or other error drops this and later output to fd (the
 * reader went away; the workers must not die of it). A reader that stops reading holds the
 * write, but never the job's stop: a stop signal, a worker's exit or --timeout's SIGALRM
 * interrupts it (the launcher's handlers do not restart system calls), and once the job must
 * stop (o->abandon) the output that cannot go out is dropped, said at the end
 * (dt__out_stalled). A stdout left non-blocking by our parent is waited on with poll(2).
 * (Polling before every write instead halved the rate of a chatty worker's lines.) */
#define OUT_STALL_MS 200
static void out_write(dt_out *o, int fd, const char *buf, size_t n) {
  while (n && !o->dead[fd]) {
    ssize_t w = write(fd, buf, n);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      if (errno == EAGAIN && poll(&p, 1, OUT_STALL_MS) > 0)
        continue; /* a non-blocking stdout took a while: no reason to ask */
      if (o->abandon && o->abandon(o->abandon_ctx)) {
        o->dead[fd] = o->stalled[fd] = true;
        return;
      }
      continue;
    }
    if (w < 0) {
      o->dead[fd] = true;
      if (fd == 1 && errno == EPIPE)
        o->broken_stdout = true;
      else if (fd == 1)
        dt_cli_stdout_failed(errno); /* a full disk: run exits 1 (main.c) */
      return;
    }
    buf += w;
    n -= (size_t)w;
  }
}

/* Before writing from src: a progress line of another source left on a terminal ends with a
 * newline, so the new text does not overwrite it and the next progress update starts below. */
static void out_settle_for(dt_out *o, int src, int fd) {
  if (o->pend_fd < 0 || o->pend_src == src)
    return;
  /* a line left open in another file may go on: as-is output stays as it came (fd -1: the
   * summary, on stderr) */
  if (o->pend_partial && fd != o->pend_fd && !o->same12)
    return;
  out_write(o, o->pend_fd, "\n", 1);
  o->pend_fd = -1;
}

void dt__out_settle(dt_out *o) { out_settle_for(o, -1, -1); }

/* After src wrote to fd ending in last: a progress line on a terminal, or a line written as is
 * without its end (rank 0's in rank0 mode, cut at its length limit or at the end of its
 * stream), gets a newline before anything else is written (out_settle_for), so that another
 * rank's line or the summary does not continue it. */
static void out_note_end(dt_out *o, int fd, int src, char last) {
  if ((last == '\r' && o->tty[fd]) || (last != '\n' && last != '\r')) {
    o->pend_fd = fd;
    o->pend_src = src;
    o->pend_partial = last != '\r';
  } else if (o->pend_src == src) {
    o->pend_fd = -1;
  }
}

bool dt__out_is_alert(const char *s, size_t n) {
  /* "refused": a worker stopping on rank 0's verdict ("rank 0 refused to resume: ...") */
  static const char *const words[] = {"error", "warn", "fatal", "hint", "exception", "traceback", "refused"};
  for (size_t i = 0; i < n; i++) {
    char c = (char)tolower((unsigned char)s[i]);
    for (size_t k = 0; k < DT_ARRAY_LEN(words); k++) {
      const char *w = words[k];
      if (c != w[0])
        continue;
      size_t j = 1;
      while (w[j] && i + j < n && tolower((unsigned char)s[i + j]) == w[j])
        j++;
      if (!w[j])
        return true;
    }
  }
  return false;
}

static void tail_record(dt_out *o, int local, int stream, const char *s, size_t n, bool cr) {
  out_rank *r = &o->r[local];
  if (n > OUT_TAIL_CHARS)
    n = OUT_TAIL_CHARS;
  tail_entry *e = NULL;
  if (r->count > 0) {
    tail_entry *last = &r->tail[(r->head + r->count - 1) % o->tail_cap];
    if (last->progress == stream)
      e = last; /* a progress display's next state, or its final line, replaces it */
  }
  if (!e) {
    if (r->count == o->tail_cap) {
      e = &r->tail[r->head];
      r->head = (r->head + 1) % o->tail_cap;
    } else {
      e = &r->tail[(r->head + r->count) % o->tail_cap];
      r->count++;
    }
  }
  char *t = realloc(e->text, n + 1);
  if (!t)
    return; /* keep the old text: the tail is a diagnostic aid, not worth failing the job */
  memcpy(t, s, n);
  t[n] = '\0';
  e->text = t;
  e->progress = cr ? stream : 0;
}

static char *out_scratch(dt_out *o, size_t n) {
  if (n > o->scratch_cap) {
    size_t cap = DT_MAX(n, 2 * o->scratch_cap);
    char *p = realloc(o->scratch, cap);
    if (!p)
      return NULL;
    o->scratch = p;
    o->scratch_cap = cap;
  }
  return o->scratch;
}

/* One complete line (s, n without its terminator `term`: "\n", "\r\n", "\r", or "" for a piece
 * cut at OUT_MAX_LINE or the end of the stream): record it, then show it per mode. Rank 0's
 * lines in rank0 mode go out as they came, terminator included; other shown lines get the
 * prefix and end in \r (progress) or \n. */
static void out_line(dt_out *o, int local, int stream, const char *s, size_t n, const char *term) {
  bool cr = !strcmp(term, "\r");
  if (cr && n == 0)
    return; /* "\r" that starts a progress display: nothing to show */
  tail_record(o, local, stream, s, n, cr);
  int rank = o->rank_base + local;
  const char *t = o->r[local].tail[(o->r[local].head + o->r[local].count - 1) % o->tail_cap].text;
  for (const char *p = t ? strstr(t, "rank ") : NULL; p; p = strstr(p + 5, "rank ")) {
    if (!o->verdict_ns && dt__run_failed_rank(p) >= 0 && (o->world <= 0 || dt__run_failed_rank(p) < o->world)) {
      o->verdict_ns = dt_now_ns();
      o->verdict_rank = dt__run_failed_rank(p);
    }
    int r = dt__run_refused_rank(p);
    if (r >= 0 && r != rank)
      o->r[local].refuser = r + 1;
  }
  bool raw0 = o->raw_stdout && rank == 0 && stream == 1;
  if (raw0)
    return; /* already copied byte for byte */
  bool asis = o->mode == DT_OUT_RANK0 && rank == 0;
  if (o->mode == DT_OUT_RANK0 && !asis && !dt__out_is_alert(s, n))
    return;
  int fd = (o->raw_stdout && stream == 1) ? 2 : stream;
  char pre[32];
  int np = asis ? 0 : snprintf(pre, sizeof pre, "[rank %d] ", rank);
  size_t nt = asis ? strlen(term) : 1;
  char *b = out_scratch(o, (size_t)np + n + nt);
  if (!b)
    return;
  memcpy(b, pre, (size_t)np);
  memcpy(b + np, s, n);
  memcpy(b + np + n, asis ? term : cr ? "\r" : "\n", nt);
  int src = local * 3 + stream;
  size_t len = (size_t)np + n + nt;
  if (len == 0)
    return;
  out_settle_for(o, src, fd);
  out_write(o, fd, b, len);
  out_note_end(o, fd, src, b[len - 1]);
}

static bool lbuf_append(lbuf *l, const char *buf, size_t n) {
  if (l->len + n > l->cap) {
    size_t cap = DT_MAX(l->len + n, 2 * l->cap);
    char *p = realloc(l->buf, cap);
    if (!p)
      return false;
    l->buf = p;
    l->cap = cap;
  }
  memcpy(l->buf + l->len, buf, n);
  l->len += n;
  return true;
}

/* Emits every complete line held for the stream; keeps the rest. A \r at the very end is held
 * until the next byte tells whether it is \r\n. */
static void out_split(dt_out *o, int local, int stream) {
  lbuf *l = &o->r[local].line[stream];
  size_t start = 0, i = 0;
  while (i < l->len) {
    char c = l->buf[i];
    if (c == '\n') {
      out_line(o, local, stream, l->buf + start, i - start, "\n");
      start = ++i;
    } else if (c == '\r') {
      if (i + 1 == l->len)
        break;
      bool crlf = l->buf[i + 1] == '\n';
      out_line(o, local, stream, l->buf + start, i - start, crlf ? "\r\n" : "\r");
      i += crlf ? 2 : 1;
      start = i;
    } else {
      i++;
    }
  }
  if (l->len - start >= OUT_MAX_LINE) {
    out_line(o, local, stream, l->buf + start, l->len - start, "");
    start = l->len;
  }
  memmove(l->buf, l->buf + start, l->len - start);
  l->len -= start;
}

void dt__out_feed(dt_out *o, int local, int stream, const char *buf, size_t n) {
  if (n == 0)
    return;
  if (o->raw_stdout && o->rank_base + local == 0 && stream == 1) {
    int src = local * 3 + stream;
    out_settle_for(o, src, 1);
    out_write(o, 1, buf, n);
    out_note_end(o, 1, src, buf[n - 1]);
  }
  lbuf *l = &o->r[local].line[stream];
  if (!lbuf_append(l, buf, n)) {
    /* No memory to hold a partial line: show what is held and the new bytes as lines
     * rather than lose them. */
    if (l->len)
      out_line(o, local, stream, l->buf, l->len, "");
    out_line(o, local, stream, buf, n, "");
    l->len = 0;
    return;
  }
  out_split(o, local, stream);
}

void dt__out_eof(dt_out *o, int local, int stream) {
  lbuf *l = &o->r[local].line[stream];
  if (l->len == 0)
    return;
  bool cr = l->buf[l->len - 1] == '\r';
  out_line(o, local, stream, l->buf, l->len - (cr ? 1 : 0), cr ? "\r" : "");
  l->len = 0;
}

int dt__out_tail_count(dt_out *o, int local) { return o->r[local].count; }

bool dt__out_stdout_broken(const dt_out *o) { return o->broken_stdout; }

int64_t dt__out_verdict_ns(const dt_out *o) { return o->verdict_ns; }
int dt__out_verdict_rank(const dt_out *o) { return o->verdict_ns ? o->verdict_rank : -1; }
int dt__out_refuser(const dt_out *o, int local) { return o->r[local].refuser - 1; }

const char *dt__out_tail_line(const dt_out *o, int local, int k) {
  const out_rank *r = &o->r[local];
  if (k < 0 || k >= r->count)
    return NULL;
  return r->tail[(r->head + k) % o->tail_cap].text;
}

void dt__out_write_tail(dt_out *o, int local, int fd, const char *indent) {
  out_rank *r = &o->r[local];
  for (int k = 0; k < r->count; k++) {
    const char *t = r->tail[(r->head + k) % o->tail_cap].text;
    if (!t)
      continue;
    size_t ni = strlen(indent), nt = strlen(t);
    char *b = out_scratch(o, ni + nt + 1);
    if (!b)
      return;
    memcpy(b, indent, ni);
    memcpy(b + ni, t, nt);
    b[ni + nt] = '\n';
    out_write(o, fd, b, ni + nt + 1);
  }
}
