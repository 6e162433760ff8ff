/* data/data_internal.h - helpers shared by the data layer's files; not part of the public API. */
#ifndef DT_DATA_INTERNAL_H
#define DT_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/core.h"

/* Bytes per element of an IDX type code; 0 for an unknown code. */
size_t dt__idx_type_size(int type);
/* "60000 x 28 x 28" into buf. */
void dt__idx_dims_str(const uint64_t *dims, int ndim, char *buf, size_t cap);

#endif
