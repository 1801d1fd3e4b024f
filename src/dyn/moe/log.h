/* Mixture of experts in a run log (log.c): the scheme's summary for
 * inspect. Private to src/dyn/moe. */
#ifndef DYNMO_DYN_MOE_LOG_H
#define DYNMO_DYN_MOE_LOG_H

#include "dynmo/dyn.h"

void moe_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w);

#endif
