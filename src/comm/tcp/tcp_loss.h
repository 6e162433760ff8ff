/* comm/tcp/tcp_loss.h - evidence that a peer's messages are lost rather than late (tcp_loss.c),
 * for the tcp transport's blocked sendrecv. */
#ifndef DT_COMM_TCP_LOSS_H
#define DT_COMM_TCP_LOSS_H

#include <stdint.h>

#include "comm/transport.h"
#include "core/core.h"

typedef struct dt__tcp_loss dt__tcp_loss;
struct dt_comm;

/* Allocates the watch of one transport (no connection yet). DT_ERR_NOMEM, *out = NULL. */
dt_status dt__tcp_loss_create(struct dt_comm *c, dt__tcp_loss **out);
/* Closes its store connection. Accepts NULL. */
void dt__tcp_loss_destroy(dt__tcp_loss *l);
/* Publishes sent[size] (messages handed to each peer so far) if it changed since the last call.
 * Blocks at most about a second; a store that does not answer is ignored. */
void dt__tcp_loss_publish(dt__tcp_loss *l, const uint64_t *sent);
/* After silent_ns without a byte from src while `arrived` of its messages have arrived: DT_OK
 * when src has not published a larger count for this rank (no evidence: keep waiting), else
 * DT_ERR_TIMEOUT with "rank S failed: no data from it for ... s in <call> (heartbeats still
 * arriving): it reports N messages sent to rank R, M arrived - its link loses data". Blocks at
 * most about a second. */
dt_status dt__tcp_loss_check(dt__tcp_loss *l, int src, uint64_t arrived, int64_t silent_ns, const dt__fp *fp);

#endif
