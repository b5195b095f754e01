/**
 * @file ep_comm_nccl_stub.c
 * @brief The NCCL communicator's entry point in a build without NCCL: MMOE_ENODEV, saying why.
 */
#include "ep_internal.h"

mmoe_status ep_nccl_group_init(mmoe_ep_group *g, int n_ranks, mmoe_error *err)
{
    (void)g;
    return mmoe_error_set(err, MMOE_ENODEV,
                          "ep: NCCL communicator over %d GPUs: this build has no NCCL (configure --with-nccl)", n_ranks);
}
