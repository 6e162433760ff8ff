/* core/faults.h - the hooks of built-in fault injection (dtrain/fault.h) that live below the
 * public API: a transport calls dt__fault_send() before it puts a message on the wire, so a
 * "delay" fault slows exactly this worker's messages. */
#ifndef DT_CORE_FAULTS_H
#define DT_CORE_FAULTS_H

/* Sleeps for an active delay fault of this worker (else one relaxed atomic load). Never fails;
 * blocks at most the fault's ms. Safe from any thread. */
void dt__fault_send(void);

#endif
