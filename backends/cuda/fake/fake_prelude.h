/* The kernel dialect on the host, for the fake driver (fake_cuda.c): one
 * work-group at a time; the items of a group that uses local memory run as
 * coroutines that switch at each barrier, the others one after another.
 * <tgmath.h> keeps float math in float, as on the GPU. */
#ifndef FAKE_PRELUDE_H
#define FAKE_PRELUDE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tgmath.h>

typedef struct fake_item {
    long lid[3], group[3], lsize[3], ngroups[3];
} fake_item;
extern fake_item fake_cur; /* the item running now */
void fake_barrier(void);

typedef struct fake_kernel {
    const char *name;
    void (*fn)(void **params); /* unpacks cuLaunchKernel's parameter array */
    int uses_local;
    int nparams;
    int sizes[64]; /* bytes of each parameter */
} fake_kernel;

#define TWK_KERNEL static void
#define TWK_GLOBAL
#define TWK_LOCAL(type, name, count) static type name[count]
#define TWK_LOCAL_PTR
#define TWK_BARRIER() fake_barrier()
#define TWK_FN static inline
#define TWK_GID(d) (fake_cur.group[d] * fake_cur.lsize[d] + fake_cur.lid[d])
#define TWK_LID(d) ((int)fake_cur.lid[d])
#define TWK_GROUP(d) (fake_cur.group[d])
#define TWK_LSIZE(d) ((int)fake_cur.lsize[d])
#define TWK_NGROUPS(d) (fake_cur.ngroups[d])

/* the OpenCL C scalar types and bit casts the kernels use (as kd_prelude_cuda.h spells them) */
typedef unsigned short ushort;
typedef unsigned int uint;
static inline float as_float(uint x) {
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}
static inline uint as_uint(float x) {
    uint u;
    memcpy(&u, &x, sizeof u);
    return u;
}
#endif
