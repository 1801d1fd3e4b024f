/* Mixture of experts in a run log (log.c): the scheme's summary for
 * inspect and its state for simulate's cost model. Private to src/dyn/moe. */
#ifndef DYNMO_DYN_MOE_LOG_H
#define DYNMO_DYN_MOE_LOG_H

#include "dynmo/dyn.h"

void moe_summarise_log(const struct dyn_log_reader *rd, const struct dyn_summary_writer *w);
/* The cost model's state of each MoE block (dyn_signal.cost_of_log of
 * /moe/rank_load): its busiest expert rank's load over the mean rank's,
 * the dense blocks 0. */
float *moe_load_of_log(const struct dyn_log_reader *rd, const struct gpt_shape *shape, long rows);

#endif
