/* The kernel dialect on the host, for the fake driver: one work-group at a
 * time; items of groups that use local memory run as coroutines switching at
 * each barrier, the others one after another. */
#ifndef FAKE_PRELUDE_H
#define FAKE_PRELUDE_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

struct fake_item {
    long lid[3], group[3], lsize[3], ngroups[3];
};
extern fake_item fake_cur;
void fake_barrier(void);

typedef struct fake_kernel {
    const char *name;
    void (*fn)(void **params);
    int uses_local;
    int nparams;
    int sizes[40];
} fake_kernel;

#define TWK_KERNEL static void
#define TWK_GLOBAL
#define TWK_LOCAL(type, name, count) static type name[count]
#define TWK_BARRIER() fake_barrier()
#define TWK_FN static inline
#define TWK_GID(d) ((long)(fake_cur.group[d] * fake_cur.lsize[d] + fake_cur.lid[d]))
#define TWK_LID(d) ((int)fake_cur.lid[d])
#define TWK_GROUP(d) ((long)fake_cur.group[d])
#define TWK_LSIZE(d) ((int)fake_cur.lsize[d])
#define TWK_NGROUPS(d) ((long)fake_cur.ngroups[d])
#endif
