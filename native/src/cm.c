// SPDX-License-Identifier: MIT
/*
 * cm.c - the connection managers, in one table (cm.h).
 */
#include "cm.h"

/* the local rendezvous first: the fast path between processes of a host */
const struct cm_ops *const cm_managers[CM_NMANAGERS + 1] = {
	&cm_local_ops, &cm_rdma_ops, NULL
};

const struct cm_ops *cm_kind(int by_name)
{
	const struct cm_ops *const *m;

	for (m = cm_managers; *m; m++)
		if ((*m)->by_name == (by_name != 0))
			return *m;
	return cm_managers[0]; /* (cannot happen: one of each kind) */
}

const struct cm_ops *cm_for(const struct cm_dial *d)
{
	return cm_kind(d->name != NULL);
}
