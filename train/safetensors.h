/* safetensors files: memory-mapped reading (one file, or a folder with a
 * sharded model.safetensors.index.json) with bf16/f16/f32 -> f32 conversion,
 * and atomic writing. Internal to train/; the public surface is train.h. */
#ifndef TWK_SAFETENSORS_H
#define TWK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "twinkle/fs.h"
#include "twinkle/status.h"

typedef enum twk_st_dtype { TWK_ST_F32, TWK_ST_F16, TWK_ST_BF16, TWK_ST_I32, TWK_ST_I64, TWK_ST_OTHER } twk_st_dtype;

typedef struct twk_st_tensor {
    char *name;
    twk_st_dtype dtype;
    char dtype_name[12];
    int ndim;
    int64_t shape[8];
    int64_t nelem;
    const unsigned char *data; /* inside a mapping; little-endian */
    size_t bytes;
} twk_st_tensor;

typedef struct twk_safetensors twk_safetensors;

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a
 * folder holding either. Errors (TWK_ERR_IO / TWK_ERR_INVALID_ARG) name the
 * file and what is wrong with it; *out is NULL then. */
twk_status twk_st_open(const char *path, twk_safetensors **out);
void twk_st_close(twk_safetensors *st);

int twk_st_count(const twk_safetensors *st);
const twk_st_tensor *twk_st_at(const twk_safetensors *st, int i);
/* The tensor named `name`, or NULL. */
const twk_st_tensor *twk_st_find(const twk_safetensors *st, const char *name);

/* The hal dtype (TWK_F32, TWK_BF16, TWK_F16) of a float safetensors dtype; -1 for the others. */
int twk_st_hal_dtype(twk_st_dtype d);
/* Converts a float tensor (f32, f16, bf16) to f32 into dst (t->nelem floats).
 * TWK_ERR_DTYPE names the tensor and dtype otherwise. */
twk_status twk_st_to_f32(const twk_st_tensor *t, float *dst);

/* Converts n floats to dtype (F32, F16 or BF16, round to nearest even; NaN stays NaN,
 * past the range: infinity) into dst; dst may be src. TWK_ERR_DTYPE for another dtype. */
twk_status twk_st_from_f32(twk_st_dtype dtype, const float *src, int64_t n, void *dst);

/* One tensor to write. dtype is F32, F16, BF16, I32 or I64; data holds nelem values of it
 * (F16 / BF16: the 2-byte little-endian encodings). */
typedef struct twk_st_entry {
    const char *name;
    twk_st_dtype dtype;
    int ndim;
    int64_t shape[8];
    const void *data;
} twk_st_entry;

/* Writes a safetensors file atomically (temp file, fsync, rename, fsync of the
 * folder): a crash leaves either the old file or the new one. `metadata` may
 * be NULL or a list of n_meta key/value string pairs. */
twk_status twk_st_write(const char *path, const twk_st_entry *entries, int n, const char *const *metadata,
                        int n_meta);

/* twk_write_file_atomic and twk_read_file are declared in twinkle/fs.h. */

#endif
