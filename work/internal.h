/*
 * internal.h — declarations shared by the files of the work module only.
 */
#ifndef CL_WORK_INTERNAL_H
#define CL_WORK_INTERNAL_H

#include "work/work.h"

/* registry.c */
void cl_work_start_cmd(cl_cmd *c);
void cl_work_schedule_retire(collie_work *w);

/* wait.c */
void cl_work_wake_waiters(collie_work *w);

/* cq.c */
void cl_cq_hold(collie_cq *cq);
void cl_cq_release(collie_cq *cq);
void cl_cq_push(collie_cq *cq, collie_work *w);

#endif
