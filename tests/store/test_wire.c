/* test_wire.c - SHA-256 / HMAC-SHA256 against the published vectors (FIPS 180-4 examples,
 * RFC 4231), constant-time compare, frame header validation, the handshake over a real socket
 * pair (right secret, wrong secret, empty secret, wrong role), and job secret loading. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/wire.h"
#include "core/sha256.h"

static void hex(const uint8_t *d, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha(const void *msg, size_t n, const char *want) {
  dt__sha256 s;
  uint8_t d[32];
  char h[65];
  dt__sha256_init(&s);
  dt__sha256_update(&s, msg, n);
  dt__sha256_final(&s, d);
  hex(d, 32, h);
  assert_string_equal(h, want);
}

static void test_sha256_vectors(void **unused) {
  check_sha("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  check_sha("", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  check_sha(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  /* One million 'a', fed in uneven pieces to exercise the partial-block path. */
  char *a = malloc(1000000);
  memset(a, 'a', 1000000);
  check_sha(a, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  dt__sha256 s;
  dt__sha256_init(&s);
  size_t off = 0, step = 1;
  while (off < 1000000) {
    size_t k = step < 1000000 - off ? step : 1000000 - off;
    dt__sha256_update(&s, a + off, k);
    off += k;
    step = step * 3 % 257 + 1;
  }
  uint8_t d[32];
  char h[65];
  dt__sha256_final(&s, d);
  hex(d, 32, h);
  assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(a);
  /* Lengths around the padding boundary (55, 56, 63, 64 bytes) against a byte-at-a-time run. */
  for (size_t n = 50; n < 130; n++) {
    uint8_t buf[130], d1[32], d2[32];
    for (size_t i = 0; i < n; i++)
      buf[i] = (uint8_t)(i * 7 + n);
    dt__sha256_init(&s);
    dt__sha256_update(&s, buf, n);
    dt__sha256_final(&s, d1);
    dt__sha256_init(&s);
    for (size_t i = 0; i < n; i++)
      dt__sha256_update(&s, buf + i, 1);
    dt__sha256_final(&s, d2);
    assert_memory_equal(d1, d2, 32);
  }
}

static void check_hmac(const uint8_t *key, size_t kn, const void *msg, size_t n, const char *want) {
  uint8_t d[32];
  char h[65];
  dt__hmac_sha256(key, kn, msg, n, d);
  hex(d, 32, h);
  assert_string_equal(h, want);
}

static void test_hmac_rfc4231(void **unused) {
  uint8_t k[131];
  memset(k, 0x0b, 20);
  check_hmac(k, 20, "Hi There", 8, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  check_hmac((const uint8_t *)"Jefe", 4, "what do ya want for nothing?", 28,
             "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  uint8_t m[50];
  memset(k, 0xaa, 20);
  memset(m, 0xdd, 50);
  check_hmac(k, 20, m, 50, "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  for (int i = 0; i < 25; i++)
    k[i] = (uint8_t)(i + 1);
  memset(m, 0xcd, 50);
  check_hmac(k, 25, m, 50, "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  memset(k, 0xaa, 131);
  const char *t6 = "Test Using Larger Than Block-Size Key - Hash Key First";
  check_hmac(k, 131, t6, strlen(t6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  const char *t7 = "This is a test using a larger than block-size key and a larger than block-size data. The key "
                   "needs to be hashed before being used by the HMAC algorithm.";
  check_hmac(k, 131, t7, strlen(t7), "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

static void test_ct_equal(void **unused) {
  uint8_t a[32] = {1, 2, 3}, b[32] = {1, 2, 3};
  assert_int_equal(dt__ct_equal(a, b, 32), 1);
  for (int i = 0; i < 32; i++) {
    b[i] ^= 0x80;
    assert_int_equal(dt__ct_equal(a, b, 32), 0);
    b[i] ^= 0x80;
  }
  assert_int_equal(dt__ct_equal(a, b, 0), 1);
}

static void test_frame_header(void **unused) {
  uint8_t h[DT_WIRE_HDR_LEN];
  dt__frame f;
  dt__frame_encode(h, 0x1234, 100);
  assert_int_equal(dt__frame_decode(h, &f, 100, "peer"), DT_OK);
  assert_int_equal(f.type, 0x1234);
  assert_int_equal(f.len, 100);
  /* Little-endian on the wire: "DTRN". */
  assert_memory_equal(h, "DTRN", 4);
  assert_int_equal(dt__frame_decode(h, &f, 99, "peer"), DT_ERR_PROTOCOL);
  assert_non_null(strstr(dt_last_error(), "claims 100 payload bytes, limit is 99"));
  h[0] ^= 1;
  assert_int_equal(dt__frame_decode(h, &f, 100, "peer"), DT_ERR_PROTOCOL);
  assert_non_null(strstr(dt_last_error(), "bad frame magic"));
  h[0] ^= 1;
  h[4] = 9;
  assert_int_equal(dt__frame_decode(h, &f, 100, "peer"), DT_ERR_PROTOCOL);
  assert_non_null(strstr(dt_last_error(), "version 9"));
  /* An absurd length (2^63) is refused from the header alone over a real socket. */
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  dt__frame_encode(h, 7, 1ull << 63);
  assert_int_equal(write(sv[0], h, sizeof h), (ssize_t)sizeof h);
  assert_int_equal(dt__frame_recv_hdr(sv[1], &f, 1 << 20, dt__deadline_after_ms(2000), "peer"), DT_ERR_PROTOCOL);
  /* Round trip of a frame with payload. */
  assert_int_equal(dt__frame_send(sv[0], 9, "hello", 5, dt__deadline_after_ms(2000), "peer"), DT_OK);
  assert_int_equal(dt__frame_recv_hdr(sv[1], &f, 5, dt__deadline_after_ms(2000), "peer"), DT_OK);
  char p[6] = {0};
  assert_int_equal(dt__sock_read_all(sv[1], p, 5, dt__deadline_after_ms(2000), "peer"), DT_OK);
  assert_string_equal(p, "hello");
  /* Nothing arrives: timeout. Closed: peer error. */
  assert_int_equal(dt__sock_read_all(sv[1], p, 1, dt__deadline_after_ms(50), "rank 3"), DT_ERR_TIMEOUT);
  assert_non_null(strstr(dt_last_error(), "rank 3"));
  close(sv[0]);
  assert_int_equal(dt__sock_read_all(sv[1], p, 1, dt__deadline_after_ms(2000), "rank 3"), DT_ERR_PEER);
  close(sv[1]);
}

typedef struct hs_arg {
  int fd;
  const char *secret;
  uint16_t role;
  uint32_t id;
  dt_status st;
  char err[1024];
} hs_arg;

static void *hs_server(void *p) {
  hs_arg *a = p;
  a->st = dt__auth_server(a->fd, (const uint8_t *)a->secret, strlen(a->secret), a->role, &a->id,
                          dt__deadline_after_ms(3000));
  snprintf(a->err, sizeof a->err, "%s", dt_last_error());
  return NULL;
}

/* Runs server and client on a socket pair; returns the client's status. */
static dt_status handshake(const char *server_secret, const char *client_secret, uint16_t srole, uint16_t crole,
                           hs_arg *srv) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  *srv = (hs_arg){.fd = sv[0], .secret = server_secret, .role = srole};
  pthread_t t;
  pthread_create(&t, NULL, hs_server, srv);
  dt_status st = dt__auth_client(sv[1], (const uint8_t *)client_secret, strlen(client_secret), crole, 42,
                                 dt__deadline_after_ms(3000));
  if (st != DT_OK)
    close(sv[1]); /* a client that gives up hangs up, as a real one does */
  pthread_join(t, NULL);
  close(sv[0]);
  if (st == DT_OK)
    close(sv[1]);
  return st;
}

static void test_handshake(void **unused) {
  hs_arg srv;
  assert_int_equal(handshake("s3cret", "s3cret", DT_ROLE_STORE, DT_ROLE_STORE, &srv), DT_OK);
  assert_int_equal(srv.st, DT_OK);
  assert_int_equal(srv.id, 42);

  assert_int_equal(handshake("s3cret", "wrong", DT_ROLE_STORE, DT_ROLE_STORE, &srv), DT_ERR_AUTH);
  assert_non_null(strstr(dt_last_error(), "refused our job secret"));
  assert_int_equal(srv.st, DT_ERR_AUTH);
  assert_non_null(strstr(srv.err, "wrong job secret"));
  assert_null(strstr(srv.err, "s3cret"));

  assert_int_equal(handshake("s3cret", "", DT_ROLE_STORE, DT_ROLE_STORE, &srv), DT_ERR_AUTH);
  assert_int_equal(srv.st, DT_ERR_AUTH);

  assert_int_equal(handshake("s3cret", "s3cret", DT_ROLE_PEER, DT_ROLE_STORE, &srv), DT_ERR_PROTOCOL);
  assert_non_null(strstr(dt_last_error(), "wrong port"));
}

/* A client facing an impostor server (wrong secret, but it replays whatever it can) refuses. */
static void *fake_server(void *p) {
  hs_arg *a = p;
  uint8_t nonce[32], hello[DT_WIRE_HDR_LEN + DT_AUTH_HELLO_LEN];
  dt__auth_hello(DT_ROLE_STORE, nonce, hello);
  dt__sock_write_all(a->fd, hello, sizeof hello, dt__deadline_after_ms(2000), "c");
  uint8_t buf[DT_WIRE_HDR_LEN + DT_AUTH_LEN];
  dt__sock_read_all(a->fd, buf, sizeof buf, dt__deadline_after_ms(2000), "c");
  /* Echo the client's own MAC back as "proof". */
  uint8_t ok[DT_WIRE_HDR_LEN + DT_AUTH_OK_LEN];
  dt__frame_encode(ok, DT_FRAME_AUTH_OK, DT_AUTH_OK_LEN);
  memcpy(ok + DT_WIRE_HDR_LEN, buf + DT_WIRE_HDR_LEN + 40, 32);
  dt__sock_write_all(a->fd, ok, sizeof ok, dt__deadline_after_ms(2000), "c");
  return NULL;
}

static void test_client_verifies_server(void **unused) {
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  hs_arg a = {.fd = sv[0]};
  pthread_t t;
  pthread_create(&t, NULL, fake_server, &a);
  assert_int_equal(dt__auth_client(sv[1], (const uint8_t *)"k", 1, DT_ROLE_STORE, 1, dt__deadline_after_ms(3000)),
                   DT_ERR_AUTH);
  assert_non_null(strstr(dt_last_error(), "could not prove the job secret"));
  pthread_join(t, NULL);
  close(sv[0]);
  close(sv[1]);
}

static void test_secret_load(void **unused) {
  uint8_t buf[256];
  size_t n;
  unsetenv("DTRAIN_JOB_SECRET");
  unsetenv("DTRAIN_JOB_SECRET_FILE");
  assert_int_equal(dt__secret_load("cfg", buf, sizeof buf, &n), DT_OK);
  assert_int_equal(n, 3);
  assert_memory_equal(buf, "cfg", 3);
  assert_int_equal(dt__secret_load(NULL, buf, sizeof buf, &n), DT_OK);
  assert_int_equal(n, 0);
  setenv("DTRAIN_JOB_SECRET", "from-env", 1);
  assert_int_equal(dt__secret_load(NULL, buf, sizeof buf, &n), DT_OK);
  assert_int_equal(n, 8);
  unsetenv("DTRAIN_JOB_SECRET");
  char path[] = "/tmp/dtrain-secret-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, "file-secret\r\n", 13), 13);
  close(fd);
  setenv("DTRAIN_JOB_SECRET_FILE", path, 1);
  assert_int_equal(dt__secret_load(NULL, buf, sizeof buf, &n), DT_OK);
  assert_int_equal(n, 11);
  assert_memory_equal(buf, "file-secret", 11);
  /* Exactly the capacity plus a newline fits; one more byte does not. */
  fd = open(path, O_WRONLY | O_TRUNC);
  char big[300];
  memset(big, 'x', sizeof big);
  big[16] = '\n';
  assert_int_equal(write(fd, big, 17), 17);
  close(fd);
  assert_int_equal(dt__secret_load(NULL, buf, 16, &n), DT_OK);
  assert_int_equal(n, 16);
  fd = open(path, O_WRONLY | O_TRUNC);
  big[16] = 'x';
  lseek(fd, 0, SEEK_SET);
  assert_int_equal(write(fd, big, 17), 17);
  close(fd);
  assert_int_equal(dt__secret_load(NULL, buf, 16, &n), DT_ERR_INVALID);
  assert_non_null(strstr(dt_last_error(), "longer than 16 bytes"));
  assert_null(strstr(dt_last_error(), "xxxx"));
  unlink(path);
  assert_int_equal(dt__secret_load(NULL, buf, sizeof buf, &n), DT_ERR_IO);
  assert_non_null(strstr(dt_last_error(), path));
  unsetenv("DTRAIN_JOB_SECRET_FILE");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sha256_vectors), cmocka_unit_test(test_hmac_rfc4231),
      cmocka_unit_test(test_ct_equal),       cmocka_unit_test(test_frame_header),
      cmocka_unit_test(test_handshake),      cmocka_unit_test(test_client_verifies_server),
      cmocka_unit_test(test_secret_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
