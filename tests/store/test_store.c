/* test_store.c - the rendezvous store's key-value operations over real sockets: set/get,
 * wait (satisfied by another process, or timing out), add from many processes and threads at
 * once, compare-and-set, claims held by a connection, delete, values at the 16 MiB limit, and oversized requests refused by
 * both the client and the server. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "store_util.h"

static dt__store_server *start_server(int port, int world) {
  dt__store_server *s;
  int bound = 0;
  assert_int_equal(dt__store_server_start("127.0.0.1", port, (const uint8_t *)SECRET, SECRET_LEN, world, 10000, &s, &bound),
                   DT_OK);
  if (port)
    assert_int_equal(bound, port);
  return s;
}

static void test_set_get_delete(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start(NULL, 0, (const uint8_t *)SECRET, SECRET_LEN, 1, 10000, &s, &port), DT_OK);
  assert_true(port > 0);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  int64_t dl = dt__deadline_after_ms(5000);
  char buf[64];
  size_t n = 0;
  assert_int_equal(dt__store_get(c, "missing", buf, sizeof buf, &n, dl), DT_ERR_NOT_FOUND);
  assert_non_null(strstr(dt_last_error(), "missing"));
  assert_int_equal(dt__store_set(c, "addr/0", "10.0.0.1:4000", 13, dl), DT_OK);
  assert_int_equal(dt__store_get(c, "addr/0", buf, sizeof buf, &n, dl), DT_OK);
  assert_int_equal(n, 13);
  assert_memory_equal(buf, "10.0.0.1:4000", 13);
  /* Overwrite with a shorter and an empty value. */
  assert_int_equal(dt__store_set(c, "addr/0", "x", 1, dl), DT_OK);
  assert_int_equal(dt__store_get(c, "addr/0", buf, sizeof buf, &n, dl), DT_OK);
  assert_int_equal(n, 1);
  assert_int_equal(dt__store_set(c, "empty", "", 0, dl), DT_OK);
  assert_int_equal(dt__store_get(c, "empty", buf, sizeof buf, &n, dl), DT_OK);
  assert_int_equal(n, 0);
  /* Too small a buffer: the full length is reported, and the connection stays usable. */
  assert_int_equal(dt__store_set(c, "long", "0123456789", 10, dl), DT_OK);
  assert_int_equal(dt__store_get(c, "long", buf, 4, &n, dl), DT_ERR_INVALID);
  assert_int_equal(n, 10);
  assert_memory_equal(buf, "0123", 4);
  assert_int_equal(dt__store_delete(c, "long", dl), DT_OK);
  assert_int_equal(dt__store_get(c, "long", buf, sizeof buf, &n, dl), DT_ERR_NOT_FOUND);
  assert_int_equal(dt__store_delete(c, "long", dl), DT_OK);
  /* Key limits. */
  char key[300];
  memset(key, 'k', sizeof key);
  key[255] = '\0';
  assert_int_equal(dt__store_set(c, key, "v", 1, dl), DT_OK);
  assert_int_equal(dt__store_get(c, key, buf, sizeof buf, &n, dl), DT_OK);
  key[255] = 'k';
  key[256] = '\0';
  assert_int_equal(dt__store_set(c, key, "v", 1, dl), DT_ERR_INVALID);
  assert_int_equal(dt__store_set(c, "", "v", 1, dl), DT_ERR_INVALID);
  /* Many keys (the table grows). */
  for (int i = 0; i < 2000; i++) {
    char k[32], v[32];
    snprintf(k, sizeof k, "many/%d", i);
    snprintf(v, sizeof v, "v%d", i * 3);
    assert_int_equal(dt__store_set(c, k, v, strlen(v), dl), DT_OK);
  }
  for (int i = 0; i < 2000; i += 97) {
    char k[32], v[32];
    snprintf(k, sizeof k, "many/%d", i);
    snprintf(v, sizeof v, "v%d", i * 3);
    assert_int_equal(dt__store_get(c, k, buf, sizeof buf, &n, dl), DT_OK);
    assert_int_equal(n, strlen(v));
    assert_memory_equal(buf, v, n);
  }
  dt__store_close(c);
  dt__store_server_stop(s);
}

static void test_cas(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 1, 10000, &s, &port), DT_OK);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  int64_t dl = dt__deadline_after_ms(5000);
  int sw = -1;
  char buf[16];
  size_t n;
  /* Absent key matches an empty expectation. */
  assert_int_equal(dt__store_cas(c, "leader", "", 0, "r1", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 1);
  /* Now present: empty expectation no longer matches, nor does a wrong one. */
  assert_int_equal(dt__store_cas(c, "leader", "", 0, "r2", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 0);
  assert_int_equal(dt__store_cas(c, "leader", "r9", 2, "r2", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 0);
  assert_int_equal(dt__store_cas(c, "leader", "r", 1, "r2", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 0);
  assert_int_equal(dt__store_get(c, "leader", buf, sizeof buf, &n, dl), DT_OK);
  assert_memory_equal(buf, "r1", 2);
  assert_int_equal(dt__store_cas(c, "leader", "r1", 2, "r2", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 1);
  assert_int_equal(dt__store_get(c, "leader", buf, sizeof buf, &n, dl), DT_OK);
  assert_int_equal(n, 2);
  assert_memory_equal(buf, "r2", 2);
  /* A value set to empty by CAS matches an empty expectation again. */
  assert_int_equal(dt__store_cas(c, "leader", "r2", 2, "", 0, &sw, dl), DT_OK);
  assert_int_equal(sw, 1);
  assert_int_equal(dt__store_cas(c, "leader", "", 0, "r3", 2, &sw, dl), DT_OK);
  assert_int_equal(sw, 1);
  dt__store_close(c);
  dt__store_server_stop(s);
}

/* A claimed key belongs to its connection: another connection with another value is refused
 * (naming the holder's address) and changes nothing, the same value from a new connection takes
 * it over, and it goes when its holder's connection closes. */
static void test_claim(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 1, 10000, &s, &port), DT_OK);
  dt__store *a, *b, *c;
  assert_int_equal(connect_store(port, 0, &a), DT_OK);
  assert_int_equal(connect_store(port, 1, &b), DT_OK);
  assert_int_equal(connect_store(port, 2, &c), DT_OK);
  int64_t dl = dt__deadline_after_ms(5000);
  char buf[32];
  size_t n = 0;
  assert_int_equal(dt__store_claim(a, "agent/1", "A", 1, dl), DT_OK);
  assert_int_equal(dt__store_claim(a, "agent/1", "A2", 2, dl), DT_OK); /* its holder may change it */
  assert_int_equal(dt__store_claim(b, "agent/1", "B", 1, dl), DT_ERR_STATE);
  assert_non_null(strstr(dt_last_error(), "key 'agent/1' is held by another connection, from 127.0.0.1:"));
  assert_int_equal(dt__store_get(c, "agent/1", buf, sizeof buf, &n, dl), DT_OK);
  assert_int_equal(n, 2);
  assert_memory_equal(buf, "A2", 2);
  assert_false(dt__store_broken(b));
  /* The same value from another connection: the same claimant, reconnected. */
  assert_int_equal(dt__store_claim(c, "agent/1", "A2", 2, dl), DT_OK);
  assert_int_equal(dt__store_claim(a, "agent/1", "A", 1, dl), DT_ERR_STATE);
  dt__store_close(a); /* no longer the holder: the key stays */
  assert_int_equal(dt__store_get(b, "agent/1", buf, sizeof buf, &n, dl), DT_OK);
  dt__store_close(c); /* the holder: the key goes, and b may claim it (the server sees the close soon) */
  dt_status st = DT_ERR_STATE;
  for (int t = 0; t < 200 && st == DT_ERR_STATE; t++) {
    st = dt__store_claim(b, "agent/1", "B", 1, dl);
    if (st == DT_ERR_STATE)
      dt__sleep_ns(5 * 1000000LL);
  }
  assert_int_equal(st, DT_OK);
  assert_int_equal(dt__store_get(b, "agent/1", buf, sizeof buf, &n, dl), DT_OK);
  assert_memory_equal(buf, "B", 1);
  /* A plain key is not claimed by anyone until a claim, and closing never takes others' keys. */
  assert_int_equal(dt__store_set(b, "plain", "p", 1, dl), DT_OK);
  assert_int_equal(connect_store(port, 3, &a), DT_OK);
  assert_int_equal(dt__store_claim(a, "plain", "q", 1, dl), DT_OK);
  dt__store_close(b);
  for (int t = 0; t < 200 && dt__store_get(a, "agent/1", buf, sizeof buf, &n, dl) == DT_OK; t++)
    dt__sleep_ns(5 * 1000000LL);
  assert_int_equal(dt__store_get(a, "agent/1", buf, sizeof buf, &n, dl), DT_ERR_NOT_FOUND);
  assert_int_equal(dt__store_get(a, "plain", buf, sizeof buf, &n, dl), DT_OK);
  assert_memory_equal(buf, "q", 1);
  dt__store_close(a);
  dt__store_server_stop(s);
}

/* ---- wait ---- */

static int child_setter(int port, int idx, void *arg) {
  dt__store *c;
  if (connect_store(port, 1, &c))
    return 10;
  usleep(300 * 1000);
  int rc = dt__store_set(c, "late", "arrived", 7, dt__deadline_after_ms(5000)) ? 11 : 0;
  dt__store_close(c);
  return rc;
}

static void test_wait(void **unused) {
  int port = mp_free_port();
  pid_t pid = spawn_child(child_setter, port, 0, NULL, 30);
  dt__store_server *s = start_server(port, 2);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  char buf[16];
  size_t n = 0;
  /* Blocks until the other process sets the key. */
  assert_int_equal(dt__store_wait(c, "late", buf, sizeof buf, &n, dt__deadline_after_ms(10000)), DT_OK);
  assert_int_equal(n, 7);
  assert_memory_equal(buf, "arrived", 7);
  assert_int_equal(reap_child(pid, 20), 0);
  /* A key nobody sets: the deadline. */
  int64_t t0 = dt_now_ns();
  assert_int_equal(dt__store_wait(c, "never", buf, sizeof buf, &n, dt__deadline_after_ms(200)), DT_ERR_TIMEOUT);
  assert_true(dt_now_ns() - t0 >= 150 * 1000000LL);
  assert_non_null(strstr(dt_last_error(), "'never' was not set within"));
  /* The connection is still in step after the timeout; an already-present key returns at once. */
  assert_int_equal(dt__store_set(c, "never", "now", 3, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(dt__store_wait(c, "never", buf, sizeof buf, &n, dt__deadline_after_ms(5000)), DT_OK);
  assert_memory_equal(buf, "now", 3);
  assert_false(dt__store_broken(c));
  /* A wait given up at once leaves the server's answer (a value, or a timeout) in the stream;
   * the next calls skip it by sequence number and get their own answers. */
  assert_int_equal(dt__store_set(c, "val", "0123456789", 10, dt__deadline_after_ms(5000)), DT_OK);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dt__store_wait(c, "val", buf, sizeof buf, &n, dt_now_ns() - 1), DT_ERR_TIMEOUT);
    assert_int_equal(dt__store_wait(c, "absent", buf, sizeof buf, &n, dt_now_ns() - 1), DT_ERR_TIMEOUT);
  }
  int64_t r = 0;
  assert_int_equal(dt__store_add(c, "ctr", 3, &r, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(r, 3);
  assert_int_equal(dt__store_get(c, "never", buf, sizeof buf, &n, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(n, 3);
  assert_memory_equal(buf, "now", 3);
  assert_false(dt__store_broken(c));
  dt__store_close(c);
  dt__store_server_stop(s);
}

/* Several waiters on one key in threads, released by one set; a waiter whose connection closes
 * is dropped by the server without harm. */
typedef struct wait_arg {
  int port, idx;
  dt_status st;
  char val[16];
} wait_arg;

static void *waiter_thread(void *p) {
  wait_arg *a = p;
  dt__store *c;
  a->st = connect_store(a->port, a->idx, &c);
  if (a->st)
    return NULL;
  size_t n = 0;
  a->st = dt__store_wait(c, "go", a->val, sizeof a->val - 1, &n, dt__deadline_after_ms(10000));
  dt__store_close(c);
  return NULL;
}

static void test_wait_many(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 8, 10000, &s, &port), DT_OK);
  /* A waiter that hangs up before the key appears. */
  dt__store *quitter;
  assert_int_equal(connect_store(port, 7, &quitter), DT_OK);
  char buf[8];
  size_t n;
  assert_int_equal(dt__store_wait(quitter, "go", buf, sizeof buf, &n, dt__deadline_after_ms(50)), DT_ERR_TIMEOUT);
  dt__store_close(quitter);
  pthread_t t[6];
  wait_arg a[6];
  for (int i = 0; i < 6; i++) {
    a[i] = (wait_arg){.port = port, .idx = i};
    pthread_create(&t[i], NULL, waiter_thread, &a[i]);
  }
  usleep(200 * 1000);
  dt__store *c;
  assert_int_equal(connect_store(port, 6, &c), DT_OK);
  assert_int_equal(dt__store_set(c, "go", "yes", 3, dt__deadline_after_ms(5000)), DT_OK);
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(a[i].st, DT_OK);
    assert_string_equal(a[i].val, "yes");
  }
  dt__store_close(c);
  dt__store_server_stop(s);
}

/* ---- add from many processes and threads ---- */

#define ADD_PROCS 4
#define ADD_THREADS 4
#define ADDS 150

static int child_adder(int port, int idx, void *arg) {
  dt__store *c;
  if (connect_store(port, idx, &c))
    return 10;
  for (int i = 0; i < ADDS; i++) {
    if (dt__store_add(c, "counter", idx + 1, NULL, dt__deadline_after_ms(10000)))
      return 11;
  }
  dt__store_close(c);
  return 0;
}

typedef struct add_arg {
  int port, idx;
  dt_status st;
} add_arg;

static void *adder_thread(void *p) {
  add_arg *a = p;
  dt__store *c;
  if ((a->st = connect_store(a->port, a->idx, &c)))
    return NULL;
  for (int i = 0; i < ADDS && !a->st; i++)
    a->st = dt__store_add(c, "counter", -1, NULL, dt__deadline_after_ms(10000));
  dt__store_close(c);
  return NULL;
}

static void test_add_concurrent(void **unused) {
  int port = mp_free_port();
  pid_t pids[ADD_PROCS];
  for (int i = 0; i < ADD_PROCS; i++)
    pids[i] = spawn_child(child_adder, port, i, NULL, 60);
  dt__store_server *s = start_server(port, 16);
  pthread_t t[ADD_THREADS];
  add_arg a[ADD_THREADS];
  for (int i = 0; i < ADD_THREADS; i++) {
    a[i] = (add_arg){.port = port, .idx = 8 + i};
    pthread_create(&t[i], NULL, adder_thread, &a[i]);
  }
  for (int i = 0; i < ADD_THREADS; i++) {
    pthread_join(t[i], NULL);
    assert_int_equal(a[i].st, DT_OK);
  }
  for (int i = 0; i < ADD_PROCS; i++)
    assert_int_equal(reap_child(pids[i], 60), 0);
  int64_t want = 0;
  for (int i = 0; i < ADD_PROCS; i++)
    want += (int64_t)(i + 1) * ADDS;
  want -= (int64_t)ADD_THREADS * ADDS;
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  int64_t r;
  assert_int_equal(dt__store_add(c, "counter", 0, &r, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(r, want);
  /* Stored as text. */
  char buf[32] = {0};
  size_t n;
  assert_int_equal(dt__store_get(c, "counter", buf, sizeof buf - 1, &n, dt__deadline_after_ms(5000)), DT_OK);
  char txt[32];
  snprintf(txt, sizeof txt, "%lld", (long long)want);
  assert_string_equal(buf, txt);
  /* A non-integer value and an overflow are refused. */
  assert_int_equal(dt__store_set(c, "text", "abc", 3, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(dt__store_add(c, "text", 1, &r, dt__deadline_after_ms(5000)), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "not a decimal integer"));
  assert_int_equal(dt__store_add(c, "big", INT64_MAX, &r, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(dt__store_add(c, "big", 1, &r, dt__deadline_after_ms(5000)), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "overflows"));
  /* An add wakes a waiter like a set does. */
  assert_int_equal(dt__store_add(c, "fresh", 5, &r, dt__deadline_after_ms(5000)), DT_OK);
  assert_int_equal(dt__store_wait(c, "fresh", buf, sizeof buf, &n, dt__deadline_after_ms(5000)), DT_OK);
  assert_memory_equal(buf, "5", 1);
  dt__store_close(c);
  dt__store_server_stop(s);
}

/* ---- large and oversized values ---- */

static void test_large_values(void **unused) {
  int port;
  dt__store_server *s;
  assert_int_equal(dt__store_server_start("127.0.0.1", 0, (const uint8_t *)SECRET, SECRET_LEN, 1, 10000, &s, &port), DT_OK);
  dt__store *c;
  assert_int_equal(connect_store(port, 0, &c), DT_OK);
  size_t big = DT_STORE_VALUE_MAX;
  uint8_t *v = malloc(big + 1), *back = malloc(big + 1);
  for (size_t i = 0; i < big + 1; i++)
    v[i] = (uint8_t)(i * 2654435761u >> 13);
  int64_t dl = dt__deadline_after_ms(30000);
  assert_int_equal(dt__store_set(c, "big", v, big, dl), DT_OK);
  size_t n = 0;
  assert_int_equal(dt__store_get(c, "big", back, big, &n, dl), DT_OK);
  assert_int_equal(n, big);
  assert_memory_equal(back, v, big);
  /* CAS with two full-size values. */
  int sw = 0;
  v[0] ^= 1;
  assert_int_equal(dt__store_cas(c, "big", back, big, v, big, &sw, dl), DT_OK);
  assert_int_equal(sw, 1);
  assert_int_equal(dt__store_get(c, "big", back, big, &n, dl), DT_OK);
  assert_int_equal(back[0], v[0]);
  /* One byte over the limit: refused before anything is sent, connection fine. */
  assert_int_equal(dt__store_set(c, "big", v, big + 1, dl), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "exceeds"));
  assert_int_equal(dt__store_get(c, "big", back, big, &n, dl), DT_OK);
  free(v);
  free(back);

  /* The server checks too: a hand-made SET whose value is one byte over the limit is answered
   * with an error, and a header claiming more than any request may carry closes the connection. */
  int fd;
  assert_int_equal(dt__sock_connect("127.0.0.1", port, dl, &fd), DT_OK);
  assert_int_equal(dt__auth_client(fd, (const uint8_t *)SECRET, SECRET_LEN, DT_ROLE_STORE, 0, dl), DT_OK);
  size_t vlen = (size_t)DT_STORE_VALUE_MAX + 1, plen = 4 + 2 + 1 + vlen;
  uint8_t *req = calloc(1, DT_WIRE_HDR_LEN + plen);
  dt__frame_encode(req, 0x5301 /* SET */, plen);
  req[DT_WIRE_HDR_LEN] = 1; /* seq 1 */
  req[DT_WIRE_HDR_LEN + 4] = 1; /* key length 1 */
  req[DT_WIRE_HDR_LEN + 6] = 'k';
  assert_int_equal(dt__sock_write_all(fd, req, DT_WIRE_HDR_LEN + plen, dl, "test"), DT_OK);
  free(req);
  dt__frame f;
  assert_int_equal(dt__frame_recv_hdr(fd, &f, 4096, dl, "test"), DT_OK);
  uint8_t resp[4096];
  assert_int_equal(dt__sock_read_all(fd, resp, f.len, dl, "test"), DT_OK);
  assert_int_equal(resp[4], DT_ERR_INVALID);
  uint8_t hdr[DT_WIRE_HDR_LEN];
  dt__frame_encode(hdr, 0x5301, 1ull << 40);
  assert_int_equal(dt__sock_write_all(fd, hdr, sizeof hdr, dl, "test"), DT_OK);
  assert_int_equal(dt__sock_read_all(fd, resp, 1, dl, "test"), DT_ERR_PEER);
  close(fd);
  /* And the store still serves. */
  assert_int_equal(dt__store_set(c, "after", "ok", 2, dl), DT_OK);
  dt__store_close(c);
  dt__store_server_stop(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_set_get_delete, kill_leftovers), cmocka_unit_test_teardown(test_cas, kill_leftovers),
      cmocka_unit_test_teardown(test_claim, kill_leftovers),
      cmocka_unit_test_teardown(test_wait, kill_leftovers),           cmocka_unit_test_teardown(test_wait_many, kill_leftovers),
      cmocka_unit_test_teardown(test_add_concurrent, kill_leftovers), cmocka_unit_test_teardown(test_large_values, kill_leftovers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
