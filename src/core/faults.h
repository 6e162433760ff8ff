/* core/faults.h - the hooks of built-in fault injection (dtrain/fault.h) that live below the
 * public API: a transport calls dt__fault_send() before it puts a message on the wire, so a
 * "delay" fault slows exactly this worker's messages, and dt__fault_drop() to learn whether a
 * "drop" fault discards one. */
#ifndef DT_CORE_FAULTS_H
#define DT_CORE_FAULTS_H

#include <stdbool.h>

/* Sleeps for an active delay fault of this worker (else one relaxed atomic load). Never fails;
 * blocks at most the fault's ms. Safe from any thread. */
void dt__fault_send(void);

/* True if a live drop fault says to discard the data frame about to be sent: the transport
 * then acts as if it went out (a link that loses data while the process and its heartbeats
 * stay alive). Counts the frame against the fault's count= and draws p= from the spec's seed.
 * Never blocks (a short mutex); safe from any thread. */
bool dt__fault_drop(void);

#endif
